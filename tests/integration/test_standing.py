"""Standing conversion on real sandbox boxes (root, openssh-server): both providers, the real
pyinfra deploy run twice, the testinfra checks, `fleet check`, and the faults a standing box
must survive: a killed node, a driver that is not the admitted one, a container restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from fleet.registry import Registry
from sandbox import manage
from sandbox.control_client import ControlClient

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

CONFIG = """
[fleet]
registry = "{state}/boxes.json"
known_hosts = "{state}/known_hosts"
ssh_key = "{state}/ssh/fleet"
releases = "{state}/releases"
daily_budget_usd = 500
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node", "miner", "prover"]
p2p_port = 26611
admitted_driver = "580.95.05"
release = "1.4.0"
allowed_cuda = ["13.0"]
[[roster.live]]
provider = "vast"
card = "RTX 4090"
count = 2
[[roster.live]]
provider = "runpod"
card = "RTX 4090"
count = 2
"""


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as e:  # a box mid-restart refuses SSH for a moment
            last = e
        else:
            if last:
                return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class Fleet:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = env

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(list(argv), cwd=REPO, env=self.env, capture_output=True, text=True,
                           timeout=600)
        if check and r.returncode != 0:
            raise AssertionError(f"{argv} failed ({r.returncode}):\n{r.stdout[-3000:]}\n"
                                 f"{r.stderr[-3000:]}")
        return r

    def fleet(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(str(BIN / "fleet"), *args, check=check)

    def deploy(self) -> str:
        r = self.run(str(BIN / "pyinfra"), "-y", "inventory.py", "deploys/standing.py")
        return r.stdout + r.stderr  # pyinfra logs to stderr

    def rows(self) -> dict[str, Any]:
        return {r.label: r for r in Registry(self.tmp / "state" / "boxes.json").live_rows()}

    def ssh(self, label: str, command: str) -> str:
        row = self.rows()[label]
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.get_host_keys().add(f"[{row.ssh_host}]:{row.ssh_port}", "ssh-ed25519",
                                   paramiko.Ed25519Key(data=_key_bytes(row.host_key)))
        client.connect(row.ssh_host, row.ssh_port, "root",
                       key_filename=str(self.tmp / "state" / "ssh" / "fleet"),
                       look_for_keys=False, allow_agent=False, timeout=15)
        try:
            _, out, _ = client.exec_command(command, timeout=60)
            return out.read().decode()
        finally:
            client.close()

    def status(self, label: str) -> dict[str, Any]:
        out = self.ssh(label, "cd /root/fleet && venv/bin/python -m agent status")
        data: dict[str, Any] = json.loads(out)
        return data

    def check(self) -> dict[str, dict[str, Any]]:
        r = self.fleet("check", "--json", check=False)
        return {h["label"]: h for h in json.loads(r.stdout)}


def _key_bytes(line: str | None) -> bytes:
    import base64

    assert line, "no pinned host key"
    return base64.b64decode(line.split()[1])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    if os.geteuid() != 0:
        raise RuntimeError("sandbox boxes need root (namespaces); run the tests as root")
    tmp = tmp_path_factory.mktemp("standing")
    (tmp / "fleet.toml").write_text(CONFIG.format(state=tmp / "state"))
    sandbox_dir = tmp / "sandbox"
    env = {**os.environ, "FLEET_CONFIG": str(tmp / "fleet.toml"),
           "FLEET_SANDBOX_DIR": str(sandbox_dir), "COLUMNS": "200", "PYINFRA_PROGRESS": "off"}
    f = Fleet(tmp, env)
    try:
        # the fourth box lands on a machine whose driver is not the admitted one
        f.fleet("sandbox", "up", "--boxes", "3", "--backend", "ns")
        env.update(manage.load_env(sandbox_dir))
        with ControlClient(env["FLEET_SANDBOX_CONTROL"]) as control:
            control.fault("driver_drift", "runpod", 1)
        f.fleet("rent", "live", "--provider", "runpod")
        yield f
    finally:
        subprocess.run([str(BIN / "fleet"), "sandbox", "down"], cwd=REPO, env=env,
                       capture_output=True, timeout=300)


def drifted(f: Fleet) -> str:
    return max(f.rows().values(), key=lambda r: r.created_at).label


def test_dry_run_changes_nothing(fleet: Fleet) -> None:
    r = fleet.run(str(BIN / "pyinfra"), "--dry", "inventory.py", "deploys/standing.py")
    out = r.stdout + r.stderr
    assert "Agent installed" in out and "Agent running" in out
    for label in fleet.rows():
        assert fleet.ssh(label, "ls /root/fleet 2>&1 || true").strip().endswith(
            "No such file or directory")
    assert not any(r.standing for r in fleet.rows().values())


def test_conversion_is_idempotent_and_verified(fleet: Fleet) -> None:
    rows = fleet.rows()
    assert len(rows) == 4 and {r.provider for r in rows.values()} == {"runpod", "vast"}
    first = fleet.deploy()
    assert "Grand total" in first
    second = fleet.deploy()
    total = next(line for line in second.splitlines() if "Grand total" in line).split()
    # Grand total <ops> <success> <error> <no change>: nothing changed, nothing failed
    assert total[3:5] == ["-", "-"], second[-2000:]
    assert all(r.standing and r.standing_since for r in fleet.rows().values())
    wait_for("a RESULT line on every box", lambda: all(
        "RESULT standing" in fleet.ssh(label, "cat /root/fleet/out/standing.log")
        for label in fleet.rows()))
    r = fleet.run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/infra",
                  check=False)
    assert r.returncode == 0, r.stdout[-4000:]


def test_every_box_is_reached_and_nvml_reports_its_machines_driver(fleet: Fleet) -> None:
    with ControlClient(fleet.env["FLEET_SANDBOX_CONTROL"]) as control:
        world = {i["label"]: i for i in control.instances()}
    probe = ("hostname; /root/fleet/venv/bin/python -c 'import pynvml; pynvml.nvmlInit(); "
             "print(pynvml.nvmlSystemGetDriverVersion())'")
    for label, row in fleet.rows().items():
        hostname, driver = fleet.ssh(label, probe).split()
        inst = world[label]
        assert hostname == (row.provider_id if row.provider == "runpod" else f"C.{row.provider_id}")
        assert driver == inst["driver_actual"]
        if label == drifted(fleet):
            assert driver != inst["driver_advertised"]
        else:
            assert driver == inst["driver_advertised"] == "580.95.05"


def test_wrong_driver_refuses_the_miner_with_zero_invocations(fleet: Fleet) -> None:
    label = drifted(fleet)
    status = fleet.status(label)
    assert not status["admission"]["admitted"]
    assert "580.95.05" in status["admission"]["reason"]
    assert status["programs"]["miner"]["pid"] is None
    assert status["programs"]["node"]["state"] == "running"  # the node needs no GPU
    assert fleet.ssh(label, "cat /root/fleet/miner-invocations.log 2>/dev/null | wc -l").strip() \
        == "0"
    verdict = wait_for("fleet check to name the driver",
                       lambda: (v := fleet.check()[label]) and "admission" in " ".join(
                           v["problems"]) and v)
    assert not verdict["well"] and "580.95.05" in verdict["admission_reason"]


def test_killed_node_comes_back_and_check_is_well_again(fleet: Fleet) -> None:
    label = next(r.label for r in fleet.rows().values() if r.provider == "vast")
    before = fleet.status(label)["programs"]["node"]["pid"]
    fleet.ssh(label, f"kill -9 {before}")
    wait_for("a new node pid", lambda: fleet.status(label)["programs"]["node"]["pid"]
             not in (None, before) and fleet.status(label)["programs"]["node"]["state"]
             == "running")
    wait_for("fleet check: well", lambda: fleet.check()[label]["well"], timeout=120)


def test_container_restart_brings_the_agent_back_through_the_start_hook(fleet: Fleet) -> None:
    for provider in ("vast", "runpod"):
        label = next(r.label for r in fleet.rows().values() if r.provider == provider)
        old = fleet.status(label)["agent"]["started_at"]
        fleet.fleet("sandbox", "fault", "container_restart", label)

        def back(label: str = label, old: str = old) -> bool:
            s = fleet.status(label)
            return bool(s["alive"] and s["agent"]["started_at"] != old
                        and s["programs"]["node"]["state"] == "running")

        wait_for(f"{label}: agent back after the container restart", back, timeout=120)
        boot_log = fleet.ssh(label, "cat /root/fleet/log/boot.log 2>/dev/null; ls /root/fleet")
        assert "agent.toml" in boot_log  # the disk survived the restart


def test_standing_boxes_are_not_destroyed_by_accident(fleet: Fleet) -> None:
    label = next(iter(fleet.rows()))
    r = fleet.fleet("destroy", label, check=False)
    assert r.returncode == 2 and "standing box" in r.stderr
    r = fleet.fleet("destroy", label, "--force", "--dry-run")
    assert "dry run: would destroy" in r.stdout
    assert label in fleet.rows()


def test_host_death_is_seen(fleet: Fleet) -> None:
    label = next(r.label for r in fleet.rows().values() if r.provider == "vast")
    fleet.fleet("sandbox", "fault", "host_death", label)

    def seen() -> bool:
        roster = json.loads(fleet.fleet("roster", "--json").stdout)
        status = {b["label"]: b["live_status"] for b in roster["boxes"]}
        return status[label] != "running"

    wait_for("the provider to report the dead host", seen, timeout=120)
    verdict = fleet.check()[label]
    assert not verdict["well"] and verdict["problems"][0].startswith("provider: box is ")


def test_zz_sandbox_down_leaves_nothing_behind(fleet: Fleet) -> None:
    boxes_dir = Path(fleet.env["FLEET_SANDBOX_DIR"]) / "boxes"
    fleet.fleet("sandbox", "down")
    leftovers = subprocess.run(["pgrep", "-f", str(boxes_dir)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "fleetbr0" not in links
    addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert "10.77." not in addrs
    assert not any(r.live for r in Registry(fleet.tmp / "state" / "boxes.json").rows())
