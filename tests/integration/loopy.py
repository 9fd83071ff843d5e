"""`fleet loop` driven tick by tick on a sandbox, for the loop's integration tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import REPO, FleetCli, wait_for, workspace

from fleet.core.boxes import Row
from fleet.state.loop_memory import Memory
from fleet.state.registry import Registry
from sandbox import manage
from sandbox.control_client import ControlClient

LOOP: dict[str, float] = {"interval_s": 10, "dead_checks": 2, "orphan_grace_s": 20}


class Loopy(FleetCli):
    def __init__(self, tmp: Path, env: dict[str, str], boxes: int) -> None:
        super().__init__(tmp, env)
        self.boxes = boxes  # the roster's size: a settled fleet has this many well boxes

    def rows(self) -> dict[str, Row]:
        return {r.label: r for r in Registry(self.tmp / "state" / "boxes.json").rows()}

    def live(self, provider: str | None = None) -> list[Row]:
        return sorted((r for r in self.rows().values()
                       if r.live and (provider is None or r.provider == provider)),
                      key=lambda r: r.created_at)

    def tick(self, *extra: str, check: bool = True) -> dict[str, Any]:
        r = self.fleet("loop", "--once", "--json", *extra, check=check)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1]
        data: dict[str, Any] = json.loads(line)
        return data

    def settle(self) -> list[Row]:
        """Tick until the roster is filled and every standing box is well (bounded)."""
        def settled() -> bool:
            t = self.tick()
            return (not t["owed"] and not t["problems"] and not t["dead"]
                    and len(t["well"]) == self.boxes)
        wait_for("a settled fleet", settled, timeout=600, poll_s=1)
        return self.live()

    def window_passed(self, seconds: float = 3600) -> None:
        """As if the disruption window (`seconds`) had passed since the loop's last destroys:
        their records in the loop's memory move that far back, and the budget is whole again."""
        path = self.tmp / "state" / "boxes.json"
        mem = Memory.load(path)
        for r in mem.disruptions:
            r["at_epoch"] = float(r["at_epoch"]) - seconds
        mem.save(path)

    def without_faults(self) -> Iterator[None]:
        """For an autouse fixture: no fault queued before or after a test, and the disruption
        budget whole at its start (the tests before it share the module's fleet: a box they
        had replaced must not hold this test's destroys for the hour)."""
        self.window_passed()
        with self.control() as c:
            c.clear_faults()
        yield
        with self.control() as c:
            c.clear_faults()

    def control(self) -> ControlClient:
        return ControlClient.from_state_dir(self.tmp / "sandbox")

    def ssh(self, row: Row, command: str) -> str:
        from fleet.boxes import boxssh
        from fleet.core.config import load

        res = boxssh.run(load(self.tmp / "fleet.toml"), row, command)
        assert res.returncode == 0, res.stderr
        return res.stdout

    def agent_alive(self, row: Row) -> bool:
        out = self.ssh(row, "cd /root/fleet && venv/bin/python -m agent status")
        return bool(json.loads(out)["alive"])

    def infra(self, *labels: str) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "FLEET_INFRA_LIMIT": ",".join(labels)}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/infra/test_standing.py"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)


def sandboxed(factory: pytest.TempPathFactory, name: str, toml: Callable[[Path], str],
              boxes: int, machines: int = 32) -> Iterator[Loopy]:
    """For a module fixture: a sandbox of its own, `machines` per provider (room for the
    replacements the tests make), no box yet; down at the end."""
    tmp, env = workspace(factory, name, toml)
    f = Loopy(tmp, env, boxes=boxes)
    try:
        f.fleet("sandbox", "up", "--boxes", "0", "--backend", "ns", "--machines", str(machines))
        env.update(manage.load_env(tmp / "sandbox"))
        yield f
    finally:
        f.fleet("sandbox", "down", check=False)
