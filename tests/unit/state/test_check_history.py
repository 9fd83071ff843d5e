"""What `fleet check` remembers of each box between two checks: an entry that does not read as
what the check wrote (not JSON, another shape, a tip that is not a number) says nothing, and the
box is judged as if first seen; no other box's check is touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import page_fixture as F
import pytest
from check_fixture import status

from fleet.boxes import boxssh
from fleet.boxes.inventory import Built
from fleet.ops import check
from fleet.state import check_history
from fleet.state.db import open_db


@pytest.mark.parametrize("damaged", ["{not json", "[1]", '"x"', "null", '{"exec_tip": "x"}',
                                     '{"exec_tip": [1]}', '{"exec_tip": true}',
                                     '{"exec_tip": 5, "moving": "yes"}'])
def test_a_damaged_entry_is_a_first_look_and_every_box_is_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: str) -> None:
    cfg = F.config(tmp_path)
    cfg.registry.parent.mkdir(parents=True)
    hosts: list[tuple[str, dict[str, Any]]] = [
        (f"live-vast-{i}", {"provider": "vast", "role": "live"}) for i in range(3)]
    monkeypatch.setattr(boxssh, "read_fact",
                        lambda *_a: boxssh.FactRead(value=status(), answered=True))
    check_history.save(cfg.registry, {"live-vast-0": {"exec_tip": 1}})
    with open_db(cfg.registry).write() as tx:
        tx.q("UPDATE check_history SET doc = ? WHERE label = 'live-vast-0'", (damaged,))
    assert "live-vast-0" not in check_history.load(cfg.registry)
    health = check.check(cfg, Built(groups={"standing": hosts}))
    assert [h.label for h in health] == [label for label, _ in hosts]
    assert health[0].exec_moving == health[1].exec_moving  # judged as a first look
