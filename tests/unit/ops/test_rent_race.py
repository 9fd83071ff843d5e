"""Two `fleet rent` at once, real processes of the CLI against the sandbox's provider APIs,
with budget room for one box: exactly one row, on SQLite and on PostgreSQL. The budget's check
and the row are one write transaction, one writer at a time on either backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_sandbox import FAST
from repo_root import ROOT

from fleet.providers.factory import get_provider
from fleet.state.registry import Registry
from sandbox.daemon import Sandbox

CONFIG = """
[fleet]
registry = "{tmp}/state/boxes.json"
daily_budget_usd = {budget}
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_rents_at_once_with_budget_room_for_one_leave_one_row(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url = (f"sqlite:///{tmp_path}/state/fleet.db" if backend == "sqlite"
           else str(request.getfixturevalue("pg_url")))
    monkeypatch.setenv("FLEET_DATABASE_URL", url)
    with Sandbox(seed=7, boot_delay=0.2, poll_interval=0.01) as sbx:
        for k, v in sbx.env().items():
            monkeypatch.setenv(k, v)
        cheapest = min(o.usd_per_hour for o in get_provider("vast", **FAST).offers())
        cfg = tmp_path / "fleet.toml"  # one box's day and half another's
        cfg.write_text(CONFIG.format(tmp=tmp_path, budget=round(cheapest * 24 * 1.5, 4)))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
               "FLEET_CONFIG": str(cfg)}
        argv = [sys.executable, "-m", "fleet.cli.main", "rent", "live", "--provider", "vast",
                "--no-wait", "--json"]
        both = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env, cwd=tmp_path) for _ in range(2)]
        done = [(p.wait(timeout=300), *p.communicate()) for p in both]
        listed = [b for b in get_provider("vast", **FAST).boxes()]
    codes = sorted(code for code, _, _ in done)
    assert codes[0] == 0 and codes[1] != 0, done
    refused = next(err for code, _, err in done if code != 0)
    assert "budget" in refused.lower(), refused
    rented = json.loads(next(out for code, out, _ in done if code == 0))
    rows = Registry(tmp_path / "state" / "boxes.json").rows()
    assert len(rows) == 1, rows
    assert len(listed) == 1 and listed[0].label == rows[0].label, (listed, rows)
    assert rows[0].label in json.dumps(rented)
