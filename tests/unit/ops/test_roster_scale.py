"""`fleet roster` over many boxes: each row's live status (running as listed, or gone where its
provider says it has no such box) found by label, no row compared with every gone one."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fleet.cli import common
from fleet.cli import main as cli
from fleet.core.boxes import Row
from fleet.providers.base import Box
from fleet.state.registry import Registry

CONFIG = """
[fleet]
registry = "{tmp}/state/boxes.json"
daily_budget_usd = 1000
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
"""


class HalfListed:
    """A Vast whose listing holds the even boxes; asked for an odd one, it has no such box."""

    name = "vast"

    def __init__(self, n: int) -> None:
        self.listed = [Box("vast", str(i), f"live-vast-{i:04d}", "RTX 4090", 1, 0.3, "running")
                       for i in range(0, n, 2)]

    def boxes(self) -> list[Box]:
        return list(self.listed)

    def box(self, box_id: str) -> Box | None:
        return None

    def charges(self, since: datetime, until: datetime) -> dict[str, float]:
        return {}


def test_the_roster_finds_gone_boxes_by_label_comparing_no_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 400
    (tmp_path / "fleet.toml").write_text(CONFIG.format(tmp=tmp_path))
    reg = Registry(tmp_path / "state" / "boxes.json")
    with reg.transaction() as rows:
        for i in range(n):
            label = f"live-vast-{i:04d}"
            rows[label] = Row(label=label, provider="vast", role="live", kind="standing",
                              card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="running",
                              provider_id=str(i), created_at="2026-12-05T00:00:00Z")
    monkeypatch.setattr(common, "_state", {})
    monkeypatch.setattr(common, "providers", lambda: {"vast": HalfListed(n)})
    compared = Counter[str]()
    eq = Row.__eq__

    def counted(self: Row, other: Any) -> Any:
        compared["rows"] += 1
        return eq(self, other)

    monkeypatch.setattr(Row, "__eq__", counted)
    done = CliRunner().invoke(cli.app, ["--config", str(tmp_path / "fleet.toml"), "roster",
                                        "--json"])
    assert done.exit_code == 0, done.output
    status = {b["label"]: b["live_status"] for b in json.loads(done.stdout)["boxes"]}
    assert status == {f"live-vast-{i:04d}": "running" if i % 2 == 0 else "gone"
                      for i in range(n)}
    assert compared["rows"] == 0
