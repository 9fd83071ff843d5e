"""A last tick that cannot be saved costs the loop's page nothing (an adversarial review's
case): the page is written, and the hook says what it did not write."""

from __future__ import annotations

from pathlib import Path

import page_fixture as F
import pytest

from fleet.cli.loop_cmd import page_after_tick
from fleet.ops.loop import AfterTickNote, Tick
from fleet.state import last_tick


def test_a_last_tick_that_cannot_be_written_does_not_cost_the_page(tmp_path: Path) -> None:
    c = F.config(tmp_path)
    c.registry.parent.mkdir(parents=True)
    last_tick.path_for(c.registry).mkdir()  # a folder in its place: the save fails
    out = tmp_path / "page"
    out.mkdir()
    write = page_after_tick(c, out)
    with pytest.raises(AfterTickNote, match="written, but not the last tick"):
        write(Tick(5, "2026-12-02T11:59:00Z"), [])
    assert (out / "index.html").exists() and (out / "fleet.json").exists()
