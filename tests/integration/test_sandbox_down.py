"""`fleet sandbox down` leaves nothing behind: no box process, mount, loop device, disk or
bridge, also after the sandbox daemon was SIGKILLed with its boxes running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import FleetCli, config, wait_for, workspace

from sandbox.boxes.cleanup import box_processes
from sandbox.boxes.disks import loops_under, mounts_under


def footprint(boxes: Path) -> dict[str, Any]:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {"processes": sorted(box_processes(boxes)), "mounts": mounts_under(boxes),
            "loops": loops_under(boxes), "bridge": "fleetbr0" in links,
            "disks": sorted(str(p) for p in boxes.glob("*/disk*")) if boxes.exists() else []}


@pytest.mark.parametrize("how", ["daemon alive", "daemon SIGKILLed"])
def test_down_leaves_nothing(tmp_path_factory: pytest.TempPathFactory, how: str) -> None:
    tmp, env = workspace(tmp_path_factory, "down", config)
    f = FleetCli(tmp, env)
    boxes = tmp / "sandbox" / "boxes"
    try:
        f.fleet("sandbox", "up", "--boxes", "2", "--backend", "ns")
        running = footprint(boxes)
        assert len(running["mounts"]) >= 2 and running["bridge"]
        assert len(running["loops"]) >= 2 or not os.path.exists("/dev/loop-control")
        if how == "daemon SIGKILLed":
            pid = json.loads((tmp / "sandbox" / "daemon.json").read_text())["pid"]
            os.kill(pid, signal.SIGKILL)
            wait_for("the daemon gone", lambda: not Path(f"/proc/{pid}").exists()
                     or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2])
            assert footprint(boxes)["processes"]  # its boxes outlive it
    finally:
        f.fleet("sandbox", "down", check=False)
    assert footprint(boxes) == {"processes": [], "mounts": [], "loops": [], "bridge": False,
                                "disks": []}
