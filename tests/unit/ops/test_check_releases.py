"""`fleet check`'s wanted release: a box's own wanted node, else its role's release looked up
in the release store, which a check reads once, not once for each box."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import page_fixture as F
import pytest

from fleet.boxes import boxssh
from fleet.boxes.inventory import Built
from fleet.ops import check
from fleet.state import releases

NODE_SHA256 = "4f1c2a9be07d3351" + "0" * 48


def test_a_check_reads_the_release_store_once_for_all_its_boxes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = F.config(tmp_path)
    cfg.registry.parent.mkdir(parents=True)
    cfg.releases.mkdir(parents=True)
    (cfg.releases / releases.MANIFEST).write_text(json.dumps([
        {"version": "1.0.0", "files": {releases.NODE_BINARY: {"sha256": NODE_SHA256, "size": 1}}}]))
    hosts: list[tuple[str, dict[str, Any]]] = [
        (f"live-vast-{i}", {"provider": "vast", "role": "live", "release": "1.0.0"})
        for i in range(40)]
    hosts += [("live-vast-own", {"provider": "vast", "role": "live", "release": "1.0.0",
                                 "node_sha16_wanted": F.OLD}),
              ("live-vast-odd", {"provider": "vast", "role": "live", "release": "9.9.9"}),
              ("live-vast-none", {"provider": "vast", "role": "live"})]
    built = Built(groups={"standing": hosts})
    # no box answers: each is judged with the release it is wanted on, nothing read from it
    monkeypatch.setattr(boxssh, "read_fact",
                        lambda *_a: boxssh.FactRead(error="connection refused"))
    loads = []
    load = releases.load

    def counted(store: Path) -> list[releases.Release]:
        loads.append(store)
        return load(store)

    monkeypatch.setattr(releases, "load", counted)
    wanted = {h.label: h.wanted_sha16 for h in check.check(cfg, built)}
    assert wanted == {**{f"live-vast-{i}": NODE_SHA256[:16] for i in range(40)},
                      "live-vast-own": F.OLD, "live-vast-odd": None, "live-vast-none": None}
    assert len(loads) == 1
