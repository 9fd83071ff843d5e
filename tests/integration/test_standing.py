"""Standing conversion on real sandbox boxes (root, openssh-server): both providers, the real
pyinfra deploy run twice, the testinfra checks, `fleet check`, and the faults a standing box
must survive: a killed node, a driver that is not the admitted one, a container restart, a
dead host.

One sandbox serves the module, and no test depends on another having run, or not run, before
it. The `converted` fixture does the conversion once (a dry run, the deploy twice, the testinfra
checks) and records what each step showed; the tests assert on that record and read the boxes.
A test that changes a box (kills its node, restarts its container, kills its host) works on a
box of its own, claimed from spares rented for that alone, which no other test looks at. The
sandbox's teardown asserts that `fleet sandbox down` leaves nothing behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import pytest
from fleet_cli import BIN, REPO, FleetCli, config, wait_for, workspace

from fleet.state.registry import Registry
from sandbox import manage
from sandbox.boxes.host import host_snapshot, snapshot_changes
from sandbox.control_client import ControlClient


class Fleet(FleetCli):
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        super().__init__(tmp, env)
        self.shared: list[str] = []  # read-only tests look at these and only these
        self.drifted = ""  # a shared box on a machine whose driver is not the admitted one
        self.spares: dict[str, list[str]] = {}  # per provider: boxes for tests that change one
        self.alone: dict[str, str] = {}  # per provider: a spare with a machine to itself

    def claim_alone(self, provider: str) -> str:
        """A converted box of `provider`, alone on its machine, that no other test uses: the
        one test that kills its host harms no other box."""
        label = self.alone.pop(provider, None)
        assert label, f"no {provider} box alone on its machine left: rent one in `fleet`"
        return label

    def claim(self, provider: str) -> str:
        """A converted box of `provider` that no other test uses; the caller may break it."""
        spares = self.spares.get(provider) or []
        assert spares, f"no spare {provider} box left: rent more in the `fleet` fixture"
        return spares.pop(0)


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


# `fleet sandbox up` rents BOXES in the roster's order (vast, runpod, vast, ...); then one more
# RunPod box lands on a machine whose driver drifted, and one Vast box of another card lands on
# a machine of its own (a host death kills every box on its machine). Of the roster's boxes the
# first of each provider stays shared, with the drifted one; SPARES are for tests that change
# a box.
BOXES = 6
SPARES = {"vast": 2, "runpod": 2}
LONE_CARD = "RTX 3090"  # no other box has it, so its machine holds no other box


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp, env = workspace(tmp_path_factory, "standing", config, columns=200)
    sandbox_dir = tmp / "sandbox"
    f = Fleet(tmp, env)
    try:
        f.fleet("sandbox", "up", "--boxes", str(BOXES), "--backend", "ns")
        env.update(manage.load_env(sandbox_dir))
        with ControlClient(env["FLEET_SANDBOX_CONTROL"]) as control:
            control.fault("driver_drift", "runpod", 1)
        f.fleet("rent", "live", "--provider", "runpod")
        f.fleet("rent", "live", "--provider", "vast", "--card", LONE_CARD)
        rows = sorted(f.rows().values(), key=lambda r: r.created_at)
        f.drifted, lone = rows[-2].label, rows[-1].label
        with ControlClient(env["FLEET_SANDBOX_CONTROL"]) as control:
            where = {i["label"]: (i["provider"], i["machine_id"]) for i in control.instances()
                     if i["phase"] != "destroyed"}
        assert Counter(where.values())[where[lone]] == 1, f"{lone} shares its machine"
        f.alone["vast"] = lone
        for provider, n in SPARES.items():
            mine = [r.label for r in rows[:-2] if r.provider == provider]
            f.spares[provider] = mine[-n:]
            f.shared += mine[:-n]
        f.shared.append(f.drifted)
        yield f
    finally:
        subprocess.run([str(BIN / "fleet"), "sandbox", "down"], cwd=REPO, env=env,
                       capture_output=True, timeout=300)
    # teardown: `fleet sandbox down` left nothing behind (reached only when setup succeeded)
    leftovers = subprocess.run(["pgrep", "-af", str(sandbox_dir / "boxes")], capture_output=True,
                               text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "fleetbr0" not in links
    addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert "10.77." not in addrs
    assert not any(r.live for r in Registry(tmp / "state" / "boxes.json").rows())


@dataclass
class Conversion:
    """What each step of the conversion showed, in the order they ran."""

    dry_run: str  # pyinfra --dry output
    before: dict[str, str]  # per box, `ls /root/fleet` right after the dry run
    standing_before: list[bool]  # the registry's standing flags right after the dry run
    first: str  # the first deploy's output
    second: str  # the second deploy's output
    infra: subprocess.CompletedProcess[str]  # pytest tests/infra against every box
    host_changed: list[str]  # what changed on this machine's /, /opt and /usr/local


@pytest.fixture(scope="module")
def converted(fleet: Fleet) -> Conversion:
    """Every box of the sandbox converted to standing (converge, idempotence, verify)."""
    host = host_snapshot()
    r = fleet.run(str(BIN / "pyinfra"), "--dry", "inventory.py", "deploys/standing.py")
    dry_run = r.stdout + r.stderr
    before = {label: fleet.ssh(label, "ls -A /root/fleet 2>&1 || true") for label in fleet.rows()}
    standing_before = [r.standing for r in fleet.rows().values()]
    first = fleet.deploy()
    second = fleet.deploy()
    wait_for("a RESULT line on every box", lambda: all(
        "RESULT standing" in fleet.ssh(label, "cat /root/fleet/out/standing.log")
        for label in fleet.rows()))
    infra = fleet.run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "tests/infra", check=False)
    changed = snapshot_changes(host, host_snapshot())
    return Conversion(dry_run, before, standing_before, first, second, infra, changed)


def test_dry_run_changes_nothing(fleet: Fleet, converted: Conversion) -> None:
    assert "Agent installed" in converted.dry_run and "Agent running" in converted.dry_run
    assert len(converted.before) == BOXES + 2
    rows = fleet.rows()
    for label, listing in converted.before.items():
        if rows[label].provider == "runpod":  # the fleet's root is the pod's volume: empty
            assert listing.strip() == "", (label, listing)
        else:
            assert listing.strip().endswith("No such file or directory"), (label, listing)
    assert not any(converted.standing_before)


def test_conversion_is_idempotent_and_verified(fleet: Fleet, converted: Conversion) -> None:
    rows = fleet.rows()
    assert len(rows) == BOXES + 2 and {r.provider for r in rows.values()} == {"runpod", "vast"}
    assert "Grand total" in converted.first
    total = next(line for line in converted.second.splitlines() if "Grand total" in line).split()
    # Grand total <ops> <success> <error> <no change>: nothing changed, nothing failed
    assert total[3:5] == ["-", "-"], converted.second[-2000:]
    assert all(r.standing and r.standing_since for r in rows.values())
    assert converted.infra.returncode == 0, converted.infra.stdout[-4000:]
    assert " passed" in converted.infra.stdout
    assert converted.host_changed == []  # the boxes wrote nothing onto this machine


def test_the_peers_deploy_names_each_box_the_others_and_changes_nothing(
        fleet: Fleet, converted: Conversion) -> None:
    """deploys/peers.py (what the loop runs when a role's endpoints change) finds the files
    the standing deploy wrote current, twice; each lists the other boxes' public mappings."""
    for _ in range(2):
        r = fleet.run(str(BIN / "pyinfra"), "-y", "inventory.py", "deploys/peers.py")
        out = r.stdout + r.stderr
        total = next(line for line in out.splitlines() if "Grand total" in line).split()
        assert total[3:5] == ["-", "-"], out[-2000:]
    rows = fleet.rows()
    for label in rows:
        want = sorted(f"{o.public_ip}:{o.p2p_public_port}" for o in rows.values()
                      if o.label != label and o.public_ip and o.p2p_public_port)
        assert fleet.ssh(label, "cat /root/fleet/peers.txt").split() == want, label


def test_every_box_is_reached_and_nvml_reports_its_machines_driver(
        fleet: Fleet, converted: Conversion) -> None:
    with ControlClient(fleet.env["FLEET_SANDBOX_CONTROL"]) as control:
        world = {i["label"]: i for i in control.instances()}
    probe = ("hostname; /root/fleet/venv/bin/python -c 'import pynvml; pynvml.nvmlInit(); "
             "print(pynvml.nvmlSystemGetDriverVersion())'")
    rows = fleet.rows()
    for label in fleet.shared:
        row = rows[label]
        hostname, driver = fleet.ssh(label, probe).split()
        inst = world[label]
        assert hostname == (row.provider_id if row.provider == "runpod" else f"C.{row.provider_id}")
        assert driver == inst["driver_actual"]
        if label == fleet.drifted:
            assert driver != inst["driver_advertised"]
        else:
            assert driver == inst["driver_advertised"] == "580.95.05"


def test_wrong_driver_refuses_the_miner_with_zero_invocations(
        fleet: Fleet, converted: Conversion) -> None:
    label = fleet.drifted
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


def test_standing_boxes_are_not_destroyed_by_accident(fleet: Fleet, converted: Conversion) -> None:
    label = fleet.shared[0]
    r = fleet.fleet("destroy", label, check=False)
    assert r.returncode == 2 and "standing box" in r.stderr
    r = fleet.fleet("destroy", label, "--force", "--dry-run")
    assert "dry run: would destroy" in r.stdout
    assert label in fleet.rows()


# --- tests that change a box: each on a box of its own -----------------------------------------

def test_killed_node_comes_back_and_check_is_well_again(fleet: Fleet,
                                                        converted: Conversion) -> None:
    label = fleet.claim("runpod")
    wait_for(f"{label}: fleet check well before the fault", lambda: fleet.check()[label]["well"])
    before = fleet.status(label)["programs"]["node"]["pid"]
    fleet.ssh(label, f"kill -9 {before}")
    wait_for("a new node pid", lambda: fleet.status(label)["programs"]["node"]["pid"]
             not in (None, before) and fleet.status(label)["programs"]["node"]["state"]
             == "running")
    wait_for("fleet check: well", lambda: fleet.check()[label]["well"], timeout=120)


@pytest.mark.parametrize("provider", ["vast", "runpod"])
def test_container_restart_brings_the_agent_back_through_the_start_hook(
        fleet: Fleet, converted: Conversion, provider: str) -> None:
    """The provider's disk rules hold (RunPod drops the container disk, keeps the volume that
    holds the fleet's root; Vast keeps its disk), and the node resumes from its kept data."""
    label = fleet.claim(provider)
    wait_for(f"{label}: node synced before the fault",
             lambda: (fleet.status(label)["node"].get("rpc") or {}).get("synced") is True)
    fleet.ssh(label, "echo here > /root/container-disk; echo here > /opt/container-disk")
    old = fleet.status(label)["agent"]["started_at"]
    fleet.fleet("sandbox", "fault", "container_restart", label)

    def back() -> bool:
        s = fleet.status(label)
        return bool(s["alive"] and s["agent"]["started_at"] != old
                    and s["programs"]["node"]["state"] == "running")

    wait_for(f"{label}: agent back after the container restart", back, timeout=120)
    kept = fleet.ssh(label, "cat /root/container-disk /opt/container-disk 2>/dev/null")
    assert kept.split() == ([] if provider == "runpod" else ["here", "here"])
    starts = [line for line in fleet.ssh(label, "cat /root/fleet/log/node.log").splitlines()
              if "fresh datadir" in line or "resuming at height" in line]
    assert len(starts) >= 2 and "resuming at height" in starts[-1], starts[-3:]
    # what the loop's next tick reads: the box is well again, nothing to replace
    wait_for(f"{label}: fleet check well", lambda: fleet.check()[label]["well"], timeout=120)


def test_host_death_is_seen(fleet: Fleet, converted: Conversion) -> None:
    label = fleet.claim_alone("vast")
    fleet.fleet("sandbox", "fault", "host_death", label)

    def seen() -> bool:
        roster = json.loads(fleet.fleet("roster", "--json").stdout)
        status = {b["label"]: b["live_status"] for b in roster["boxes"]}
        return status[label] != "running"

    wait_for("the provider to report the dead host", seen, timeout=120)
    verdict = fleet.check()[label]
    assert not verdict["well"] and verdict["problems"][0].startswith("provider: box is ")


# the agent restarted with a one-second tick (so that three ticks pass in seconds), the way a
# deploy replaces it: TERM, wait until it is gone, start again; its programs are adopted
_FAST_TICK = """
cd /root/fleet || exit 1
sed -i '1i tick_s = 1' agent.toml
pid=$(cat run/agent.pid)
kill -TERM "$pid"
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
exec venv/bin/python -m agent run --config /root/fleet/agent.toml
"""


def test_infra_checks_fail_a_box_that_stopped_reporting(fleet: Fleet, converted: Conversion,
                                                         tmp_path: Path) -> None:
    """The freshness checks tell the truth: on a box whose agent is frozen (SIGSTOP) after
    agent.toml was written again, exactly the checks of those two faults fail."""
    label = fleet.claim("vast")
    fleet.ssh(label, _FAST_TICK)

    def reporting() -> bool:
        s = fleet.status(label)
        return bool(s["alive"] and s["agent"]["tick_s"] == 1 and s["node"]["rpc"]
                    and s["observer"]["round_at"]
                    and all(p["reading_at"] for p in s["programs"].values()))

    # frozen only once it has reported everything: what goes stale is then only the time
    wait_for(f"{label}: the agent back with a one-second tick, reporting", reporting)
    fleet.ssh(label, "cd /root/fleet && kill -STOP $(cat run/agent.pid) && touch agent.toml")
    try:
        # alive turns false once the heartbeat is 3 ticks + 5 s old: the status is stale too
        wait_for(f"{label}: the frozen agent's status gone stale",
                 lambda: not fleet.status(label)["alive"], timeout=60)
        inventory = tmp_path / "one_box.py"
        inventory.write_text(
            "import runpy\n"
            f"_all = runpy.run_path({str(REPO / 'inventory.py')!r})\n"
            f"standing = [h for h in _all.get('standing', []) if h[0] == {label!r}]\n")
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf",
             "tests/infra/test_standing.py"], cwd=REPO, capture_output=True, text=True,
            timeout=600, env={**fleet.env, "FLEET_INVENTORY": str(inventory),
                              "FLEET_INFRA_SETTLE_S": "0"})
    finally:
        fleet.ssh(label, "kill -CONT $(cat /root/fleet/run/agent.pid)")
    failed = {line.split("::", 1)[1].split("[", 1)[0] for line in r.stdout.splitlines()
              if line.startswith("FAILED ")}
    assert failed == {"test_agent_runs_with_a_fresh_heartbeat",
                      "test_status_was_written_within_three_ticks",
                      "test_agent_started_after_its_config_was_written"}, r.stdout[-4000:]
    assert f"[{label}]" in r.stdout and " passed" in r.stdout
