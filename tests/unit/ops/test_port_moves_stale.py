"""Adversarial review of owed ports: scenarios that held (kept as guards)."""

from __future__ import annotations

from typing import Any

import pytest
from test_ports import porting_loop, replacing

from fleet.core.errors import ProviderError
from fleet.core.verdicts import Health
from sandbox.daemon import Sandbox


def test_review_held_old_kept_while_the_listing_fails_or_the_reading_is_stale(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    old, new = replacing(sbx, lp, "live-h-oooooo")
    # a stale reading: peers unknown, not synced known
    verdicts[new.label] = Health(new.label, "vast", ssh=True, agent=True, synced=None,
                                 peers_in=None, problems=["node: reading is 900 s old"])
    lp.tick()
    assert lp.reg.get(old.label).live  # type: ignore[union-attr]
    verdicts.pop(new.label)
    vast = lp.providers["vast"]
    real = vast.boxes

    def failing() -> Any:
        raise ProviderError("vast", "list", "HTTP 500")

    vast.boxes = failing  # type: ignore[method-assign]
    t = lp.tick()
    assert lp.reg.get(old.label).live, t.actions  # type: ignore[union-attr]
    assert [r.label for r in lp.reg.rows() if r.move_of == old.label] == [new.label]
    vast.boxes = real  # type: ignore[method-assign]
    t = lp.tick()
    assert not lp.reg.get(old.label).live, t.actions  # type: ignore[union-attr]
