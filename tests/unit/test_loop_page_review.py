"""A last tick that cannot be saved costs the loop's page nothing (an adversarial review's
case): the page is written, and the hook says what it did not write."""

from __future__ import annotations

from pathlib import Path

import page_fixture as F
import pytest
from state_fixture import add_rows, sql

from fleet.cli.loop_cmd import page_after_tick
from fleet.ops.loop import AfterTickNote, Tick
from fleet.state import last_tick


def test_a_last_tick_that_cannot_be_written_does_not_cost_the_page(tmp_path: Path) -> None:
    c = F.config(tmp_path)
    add_rows(c.registry, F.rows())
    last_tick.save(c.registry, 4, "2026-12-02T11:58:00Z", F.health(), now=F.NOW)
    # the database's disk is full: it reads, but grows by no page (this connection's limit)
    (pages,) = sql(c.registry, "PRAGMA page_count")
    sql(c.registry, f"PRAGMA max_page_count = {pages[0]}")
    out = tmp_path / "page"
    out.mkdir()
    write = page_after_tick(c, out)
    with pytest.raises(AfterTickNote, match="written, but not the last tick .*full"):
        write(Tick(5, "2026-12-02T11:59:00Z"), F.health() * 50)
    assert (out / "index.html").exists() and (out / "fleet.json").exists()
    tick = last_tick.load(c.registry)
    assert tick is not None and tick.number == 4  # the tick before, whole
