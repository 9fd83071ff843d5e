"""`fleet check` on sandbox boxes over their master connections (`fleet.boxes.sshmux`): one login
across checks run as separate commands, a box that dies read as not answering, and the master
closed when the box is destroyed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import FleetCli, config, wait_for, workspace

from fleet.boxes import sshmux
from fleet.core.boxes import Row
from fleet.state.registry import Registry
from sandbox import manage


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetCli]:
    tmp, env = workspace(tmp_path_factory, "check-reuse", config)
    f = FleetCli(tmp, env)
    try:
        f.fleet("sandbox", "up", "--boxes", "2", "--backend", "ns")
        env.update(manage.load_env(tmp / "sandbox"))
        yield f
    finally:
        f.fleet("sandbox", "down", check=False)


def _rows(f: FleetCli) -> list[Row]:
    return sorted((r for r in Registry(f.tmp / "state" / "boxes.json").rows() if r.live),
                  key=lambda r: r.label)


def _master(f: FleetCli, row: Row) -> str:
    socket = sshmux.path(str(f.tmp / "state" / "known_hosts"), "root", row.ssh_host or "",
                         row.ssh_port or 0, row.host_key or "")
    assert socket is not None
    return socket


def _logins(f: FleetCli) -> int:
    return sum(p.read_text(errors="replace").count("Accepted publickey")
               for p in (f.tmp / "sandbox").glob("boxes/*/log/sshd.log"))


def _check(f: FleetCli, label: str) -> dict[str, Any]:
    out = f.fleet("check", "--json", check=False).stdout  # the box has no agent: not well
    return next(h for h in json.loads(out) if h.get("label") == label)


def test_checks_run_as_separate_commands_share_one_login_and_destroy_closes_the_master(
        fleet: FleetCli) -> None:
    row = _rows(fleet)[0]
    first = _check(fleet, row.label)
    assert first["ssh"] is True, first
    seen = _logins(fleet)
    socket = _master(fleet, row)
    assert sshmux.running(socket)
    for _ in range(2):  # each its own process, like the loop's ticks
        assert _check(fleet, row.label)["ssh"] is True
    assert _logins(fleet) == seen  # no new key exchange or login
    fleet.fleet("destroy", "--force", row.label)
    assert not sshmux.running(socket) and not Path(socket).exists()


def test_a_box_that_dies_behind_its_master_reads_as_not_answering(fleet: FleetCli) -> None:
    row = _rows(fleet)[-1]
    assert _check(fleet, row.label)["ssh"] is True
    assert sshmux.running(_master(fleet, row))
    fleet.fleet("sandbox", "fault", "host_death", row.label)
    # bounded: the check's own deadlines, and the master's keep-alive (15 s)
    dead = wait_for("the check to read the dead box",
                    lambda: (h := _check(fleet, row.label)) and h["ssh"] is False and h,
                    timeout=180)
    assert any(p.startswith(("ssh:", "provider:")) for p in dead["problems"]), dead
