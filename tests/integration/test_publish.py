"""Publishing a node release on real sandbox boxes (root, openssh-server): 4 converted boxes on
both providers, the real `pyinfra` and `fleet` CLIs, and what a rollout must survive: a
corrupted staged file, a release that never syncs, the agent SIGKILLed mid-switch, a box ahead,
a box unreachable over SSH, bad input.

One sandbox serves the module. Each test starts from the same baseline (every box runs 1.4.0,
synced, nothing of 1.5.0 staged, no knobs, no publish record, the registry wanting 1.4.0),
which the autouse `baseline` fixture restores before it, so no test depends on another.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import psutil
import pytest
from fleet_cli import BIN, REPO, FleetCli, config, wait_for, workspace

from fleet.state import releases
from fleet.state.registry import Registry
from sandbox import manage
from sandbox.control_client import ControlClient

ROOT = "/root/fleet"
AGENT = f"cd {ROOT} && venv/bin/python -m agent"
FAST = ["--stable-s", "2", "--deadline-s", "60"]


class Fleet(FleetCli):
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        super().__init__(tmp, env)
        self.store = tmp / "state" / "releases"

    def publish(self, *args: str) -> tuple[int, dict[str, Any], str]:
        r = self.fleet("publish", *args, "--json", check=False)
        try:
            data = json.loads(r.stdout)
        except ValueError:
            data = {}
        return r.returncode, data, r.stderr

    def pyinfra(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(str(BIN / "pyinfra"), "-y", *args, check=check)

    def release(self, version: str) -> releases.Release:
        return releases.find(self.store, version)

    def rows(self) -> dict[str, Any]:
        return {r.label: r for r in Registry(self.tmp / "state" / "boxes.json").live_rows()
                if r.role == "live"}

    def ssh(self, label: str, command: str, timeout: float = 120) -> str:
        row = self.rows()[label]
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.get_host_keys().add(f"[{row.ssh_host}]:{row.ssh_port}", "ssh-ed25519",
                                   paramiko.Ed25519Key(data=base64.b64decode(
                                       row.host_key.split()[1])))
        client.connect(row.ssh_host, row.ssh_port, "root",
                       key_filename=str(self.tmp / "state" / "ssh" / "fleet"),
                       look_for_keys=False, allow_agent=False, timeout=15)
        try:
            _, out, _ = client.exec_command(command, timeout=timeout)
            return out.read().decode()
        finally:
            client.close()

    def readback(self, label: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.ssh(label, f"{AGENT} readback"))
        return data

    def node(self, label: str) -> tuple[int, str, str | None]:
        """(pid, sha16, version) of the node that runs on the box."""
        n = self.readback(label)["node"]
        return n["pid"], n["sha256"][:16], n["version"]

    def box_dir(self, label: str) -> Path:
        with ControlClient(self.env["FLEET_SANDBOX_CONTROL"]) as control:
            box_id = next(i["box_id"] for i in control.instances() if i["label"] == label)
        return Path(self.env["FLEET_SANDBOX_DIR"]) / "boxes" / box_id

    def init(self, label: str) -> int:
        """The pid (on the host) of the box's init: its namespaces are the box's."""
        pid: int = json.loads((self.box_dir(label) / "box.json").read_text())["pid"]
        return pid

    def sshds(self, label: str) -> list[psutil.Process]:
        """Every sshd in the box: its listener and its sessions. A session outlives a killed
        listener (its init adopts it), and a listener started again (`ssh_up`) is a child of
        nsenter: neither is told apart by its parent."""
        ns = os.readlink(f"/proc/{self.init(label)}/ns/pid")
        found = []
        for p in psutil.process_iter(["name"]):
            try:
                if p.info["name"] == "sshd" and os.readlink(f"/proc/{p.pid}/ns/pid") == ns:
                    found.append(p)
            except (OSError, psutil.Error):
                continue  # gone meanwhile
        return found

    def listening(self, label: str) -> bool:
        """Whether something listens on port 22 in the box's network namespace."""
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{self.init(label)}/net/{table}") as f:
                for line in f.read().splitlines()[1:]:
                    local, state = line.split()[1], line.split()[3]
                    if local.endswith(":0016") and state == "0A":  # port 22, LISTEN
                        return True
        return False

    def ssh_down(self, label: str) -> None:
        """Nothing listens on the box's port 22 any more (its sshds are killed, host-side)."""
        found = self.sshds(label)
        assert found, f"{label}: no sshd runs in the box"
        for proc in found:
            proc.kill()
        psutil.wait_procs(found, timeout=10)
        wait_for(f"{label}: port 22 closed", lambda: not self.listening(label))

    def ssh_up(self, label: str) -> None:
        """A new sshd in the box's namespaces, as its init started the first one; none while
        one listens (a second could not bind the port)."""
        if self.listening(label):
            return
        init = self.init(label)
        path = self.box_dir(label) / "log" / "sshd.log"
        with open(path, "ab") as log:
            since = log.tell()
            sshd = subprocess.Popen(["nsenter", "-t", str(init), "-m", "-u", "-i", "-n", "-p",
                                     "--", "/usr/sbin/sshd", "-D", "-e", "-f",
                                     "/run/sandbox/sshd_config"],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True)

        def answers() -> bool:
            if sshd.poll() is not None:  # fail now, in sshd's own words
                with open(path, "rb") as f:
                    f.seek(since)
                    words = f.read().decode(errors="replace")
                pytest.fail(f"{label}: sshd exited ({sshd.returncode}): {words[-2000:]}")
            return self.ssh(label, "echo up").strip() == "up"

        wait_for(f"{label}: SSH again", answers)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp, env = workspace(tmp_path_factory, "publish", config)
    sandbox_dir = tmp / "sandbox"
    f = Fleet(tmp, env)
    try:
        f.fleet("sandbox", "up", "--boxes", "4", "--backend", "ns")
        env.update(manage.load_env(sandbox_dir))
        f.pyinfra("--limit", "standing", "inventory.py", "deploys/standing.py")
        old = f.release("1.4.0")
        for label in f.rows():
            wait_for(f"{label}: 1.4.0 synced", lambda label=label: (
                (n := f.readback(label)["node"]) and n["version"] == "1.4.0" and n["synced"]))
        assert len(f.rows()) == 4 and {r.provider for r in f.rows().values()} == {"runpod",
                                                                                   "vast"}
        assert all(r.node_sha16_wanted == old.node_sha16 for r in f.rows().values())
        yield f
    finally:
        subprocess.run([str(BIN / "fleet"), "sandbox", "down"], cwd=REPO, env=env,
                       capture_output=True, timeout=300)


@pytest.fixture(autouse=True)
def baseline(fleet: Fleet) -> Fleet:
    """Every box on 1.4.0 and synced, 1.5.0 not staged, no knobs, no record, wanted 1.4.0."""
    old, new = fleet.release("1.4.0"), fleet.release("1.5.0")
    for label in fleet.rows():
        fleet.ssh_up(label)
        # no knobs, no stopped program, an agent running (a second `run` just says so)
        fleet.ssh(label, f"rm -f {ROOT}/node/knobs.json; cd {ROOT} && kill -CONT "
                  "$(pgrep -f releases/) 2>/dev/null; venv/bin/python -m agent run "
                  "--config agent.toml")
        if fleet.node(label)[1] != old.node_sha16:
            out = fleet.ssh(label, f"{AGENT} switch --config agent.toml --node "
                            f"{ROOT}/releases/{old.node_sha16}/igneumd --sha256 "
                            f"{old.node_sha256} --stable-s 1 --deadline-s 90")
            assert json.loads(out)["outcome"] == "switched", out
        fleet.ssh(label, f"rm -rf {ROOT}/releases/{new.node_sha16}")
        wait_for(f"{label}: 1.4.0 synced", lambda label=label: (
            (n := fleet.readback(label)["node"]) and n["version"] == "1.4.0" and n["synced"]))
    for rec in fleet.store.glob("*/publish.json"):
        rec.unlink()
    with Registry(fleet.tmp / "state" / "boxes.json").transaction() as rows:
        for row in rows.values():
            row.node_sha16_wanted = old.node_sha16 if row.role == "live" else None
    return fleet


def by_label(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["label"]: row for row in data["boxes"]}


def test_publish_canary_then_the_rest_rerun_switches_nothing_infra_passes(fleet: Fleet) -> None:
    new = fleet.release("1.5.0")
    labels = sorted(fleet.rows())
    canary = next(x for x in labels if fleet.rows()[x].provider == "runpod")
    rc, data, err = fleet.publish("1.5.0", "--canary", canary, "--waves", "1,rest", *FAST)
    assert rc == 0, err[-3000:]
    assert data["waves"] == [[canary], sorted(x for x in labels if x != canary)]
    assert sorted(data["switched_now"]) == labels
    rows = by_label(data)
    for label in labels:
        row = rows[label]
        assert row["state"] == "switched" and row["matches_manifest"], row
        assert row["version"] == "1.5.0" and row["node_sha256"] == new.node_sha256
        assert row["node_kind"] == "script" and row["started_after_pointer"] is True
        assert row["miner_version"] == row["prover_version"] == "1.4.0"  # conversion's release
        assert row["downtime_s"] is None or row["downtime_s"] >= 0
        pid, sha16, version = fleet.node(label)  # what runs, read again
        assert (sha16, version) == (new.node_sha16, "1.5.0")
    record = json.loads((fleet.store / "1.5.0" / "publish.json").read_text())
    assert record["outcome"] == "done" and {b["state"] for b in record["boxes"].values()} == {
        "switched"}
    assert record["boxes"][canary]["wave"] == 1 and all(
        record["boxes"][x]["wave"] == 2 for x in labels if x != canary)
    assert all(r.node_sha16_wanted == new.node_sha16 for r in fleet.rows().values())

    pids = {x: fleet.node(x)[0] for x in labels}
    again = fleet.fleet("publish", "1.5.0", "--canary", canary, *FAST)  # the table, as seen
    assert "0 boxes switched now" in again.stdout, again.stdout
    assert again.stdout.count(" ok") >= 4 and "MISMATCH" not in again.stdout
    assert {x: fleet.node(x)[0] for x in labels} == pids  # no node was restarted
    (fleet.tmp / "table.txt").write_text(again.stdout)

    infra = fleet.run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "tests/infra", check=False)
    assert infra.returncode == 0, infra.stdout[-4000:]
    checks = json.loads(fleet.fleet("check", "--json", check=False).stdout)
    assert not any("behind" in p for h in checks for p in h["problems"]), checks


def test_a_corrupted_staged_file_stops_the_publish_before_any_switch(fleet: Fleet) -> None:
    new = fleet.release("1.5.0")
    labels = sorted(fleet.rows())
    bad = labels[1]
    fleet.pyinfra("--limit", bad, "inventory.py", "deploys/publish.py", "--data",
                  "release=1.5.0", "--data", "stage_only=1")
    fleet.ssh(bad, f"echo corrupt >> {ROOT}/releases/{new.node_sha16}/igneum-prover")
    before = {x: fleet.node(x) for x in labels}
    rc, data, err = fleet.publish("1.5.0", *FAST)
    assert rc == 1
    assert f"staging failed on {bad}" in err and "igneum-prover: FAILED" in err, err[-2000:]
    assert by_label(data)[bad]["state"] == "failed"
    assert data["switched_now"] == []
    assert {x: fleet.node(x) for x in labels} == before  # the old nodes run on, untouched
    record = json.loads((fleet.store / "1.5.0" / "publish.json").read_text())
    assert record["boxes"][bad]["state"] == "failed" and record["outcome"] == "failed"
    assert {record["boxes"][x]["state"] for x in labels if x != bad} == {"untouched"}


def test_a_release_that_never_syncs_is_reverted_and_stops_the_waves(fleet: Fleet) -> None:
    old = fleet.release("1.4.0")
    labels = sorted(fleet.rows())
    canary = labels[2]
    fleet.ssh(canary, f"echo '{{\"never_sync_versions\": [\"1.5.0\"]}}' > "
              f"{ROOT}/node/knobs.json")
    before = {x: fleet.node(x) for x in labels if x != canary}
    rc, data, err = fleet.publish("1.5.0", "--canary", canary, "--stable-s", "2",
                                  "--deadline-s", "20")
    assert rc == 1
    assert canary in err and "reverted" in err and "no further wave" in err, err[-2000:]
    (fleet.tmp / "revert.txt").write_text(err)  # what the operator saw (for the docs)
    row = by_label(data)[canary]
    assert row["state"] == "reverted" and row["version"] == "1.4.0"
    assert row["node_sha256"] == old.node_sha256
    assert fleet.node(canary)[1:] == (old.node_sha16, "1.4.0")  # read back again: the old one
    assert {x: fleet.node(x) for x in labels if x != canary} == before  # no later wave
    assert data["switched_now"] == []
    # the registry wants 1.5.0 there now: `fleet check` names the box behind it
    checks = json.loads(fleet.fleet("check", "--json", check=False).stdout)
    problems = next(h["problems"] for h in checks if h["label"] == canary)
    assert any(p.startswith("node: behind: runs 1.4.0") for p in problems), problems


def test_agent_sigkilled_mid_switch_still_ends_on_the_new_release(fleet: Fleet) -> None:
    old, new = fleet.release("1.4.0"), fleet.release("1.5.0")
    label = sorted(fleet.rows())[0]
    fleet.pyinfra("--limit", label, "inventory.py", "deploys/publish.py", "--data",
                  "release=1.5.0", "--data", "stage_only=1")
    # a box-side sampler: every node process seen, every 20 ms
    sampler = (
        "import os, time, json\n"
        "seen = None\n"
        "end = time.time() + 240\n"
        "with open('/tmp/nodes.log', 'w') as f:\n"
        "    while time.time() < end:\n"
        "        now = []\n"
        "        for p in os.listdir('/proc'):\n"
        "            try:\n"
        "                a = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
        "            except OSError:\n"
        "                continue\n"
        "            prog = a[1] if a[0].endswith(b'python3') and len(a) > 1 else a[0]\n"
        "            if prog.endswith(b'/igneumd'):  # the node itself (a script), not a\n"
        "                now.append([int(p), prog.decode()])  # command naming it\n"
        "        if now != seen:\n"
        "            f.write(json.dumps([time.time(), sorted(now)]) + '\\n'); f.flush()\n"
        "            seen = now\n"
        "        time.sleep(0.02)\n")
    fleet.ssh(label, f"cat > /tmp/sampler.py <<'EOF'\n{sampler}EOF\n"
              "nohup python3 /tmp/sampler.py >/dev/null 2>&1 &")
    old_pid = fleet.node(label)[0]
    # the old node will not stop at once: it holds a SIGTERM until the agent's grace runs out
    fleet.ssh(label, f"kill -STOP {old_pid}")
    deploy = subprocess.Popen(
        [str(BIN / "pyinfra"), "-y", "--limit", label, "inventory.py", "deploys/publish.py",
         "--data", "release=1.5.0", "--data", "switch_only=1", "--data", "stable_s=2",
         "--data", "deadline_s=150"], cwd=REPO, env=fleet.env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        def stopping() -> bool:
            state = json.loads(fleet.ssh(label, f"cat {ROOT}/run/state.json"))
            sw = state.get("switch") or {}
            return sw.get("to_sha16") == new.node_sha16 and sw.get("old_exit_at") is None

        wait_for("the agent to begin stopping the old node", stopping, timeout=60)
        agent_pid = int(fleet.ssh(label, f"cat {ROOT}/run/agent.pid").split()[0])
        fleet.ssh(label, f"kill -KILL {agent_pid}")
        # the start hook (or an operator) starts the agent again
        fleet.ssh(label, f"{AGENT} run --config agent.toml")
        out, _ = deploy.communicate(timeout=300)
    finally:
        if deploy.poll() is None:
            deploy.kill()
    assert deploy.returncode == 0, out[-3000:]
    assert fleet.node(label)[1:] == (new.node_sha16, "1.5.0")
    samples = [json.loads(line) for line in fleet.ssh(label, "pkill -f '/tmp/[s]ampler.py'; "
                                                             "cat /tmp/nodes.log").splitlines()]
    logs = fleet.ssh(label, f"tail -40 {ROOT}/log/agent.log; tail -15 {ROOT}/log/node.log")
    # never two nodes
    assert samples and max(len(s[1]) for s in samples) == 1, json.dumps(samples) + "\n" + logs
    paths = [s[1][0][1] for s in samples if s[1]]
    first_new = next(i for i, p in enumerate(paths) if new.node_sha16 in p)
    assert all(new.node_sha16 in p for p in paths[first_new:]), paths  # never back to old
    assert old.node_sha16 in paths[0]


def test_a_box_ahead_is_not_downgraded_unless_allowed(fleet: Fleet) -> None:
    old, new = fleet.release("1.4.0"), fleet.release("1.5.0")
    labels = sorted(fleet.rows())
    ahead = labels[3]
    fleet.pyinfra("--limit", ahead, "inventory.py", "deploys/publish.py", "--data",
                  "release=1.5.0", "--data", "stable_s=1", "--data", "deadline_s=60")
    pid = fleet.node(ahead)[0]
    rc, data, err = fleet.publish("1.4.0", *FAST)
    assert rc == 0, err[-2000:]
    rows = by_label(data)
    assert rows[ahead]["state"] == "ahead" and "1.5.0" in rows[ahead]["note"]
    assert all(rows[x]["state"] == "switched" for x in labels if x != ahead)
    assert fleet.node(ahead) == (pid, new.node_sha16, "1.5.0")
    rc, data, err = fleet.publish("1.4.0", "--allow-downgrade", ahead, *FAST)
    assert rc == 0, err[-2000:]
    assert data["switched_now"] == [ahead]
    assert fleet.node(ahead)[1:] == (old.node_sha16, "1.4.0")


def test_an_unreachable_box_is_reported_and_the_same_command_resumes(fleet: Fleet) -> None:
    new = fleet.release("1.5.0")
    labels = sorted(fleet.rows())
    down = labels[0]
    fleet.ssh_down(down)
    try:
        rc, data, err = fleet.publish("1.5.0", *FAST)
        assert rc == 1
        assert f"unreachable: {down}" in err, err[-2000:]
        rows = by_label(data)
        assert rows[down]["state"] == "unreachable"
        assert all(rows[x]["state"] == "switched" for x in labels if x != down)
    finally:
        fleet.ssh_up(down)
    assert fleet.node(down)[1] != new.node_sha16
    rc, data, err = fleet.publish("1.5.0", *FAST)
    assert rc == 0, err[-2000:]
    assert data["switched_now"] == [down]
    assert all(row["state"] == "switched" for row in data["boxes"])


def test_bad_input_is_one_line_exit_2_and_changes_nothing(fleet: Fleet) -> None:
    labels = sorted(fleet.rows())
    bench = fleet.fleet("rent", "bench", "--provider", "vast", "--json")
    oneshot = json.loads(bench.stdout)["label"]
    src = fleet.tmp / "build-1.6.0"
    src.mkdir(exist_ok=True)
    for name in releases.FILES:
        (src / name).write_text(f"#!/bin/sh\necho {name} 1.6.0\n")
    fleet.fleet("release", "add", str(src), "--version", "1.6.0")
    (fleet.store / "1.6.0" / "igneumd").unlink()
    registry = Registry(fleet.tmp / "state" / "boxes.json").rows()
    before = {x: fleet.node(x) for x in labels}
    cases = {
        ("9.9.9",): "error: no release '9.9.9'",
        ("1.6.0",): "error: release 1.6.0 in",
        ("1.5.0", "--canary", oneshot): f"error: --canary {oneshot}: it is not a converted",
        ("1.5.0", "--canary", "no-such-box"): "error: --canary no-such-box: no such box",
        ("1.5.0", "--allow-downgrade", "no-such-box"): "error: --allow-downgrade no-such-box",
    }
    for args, message in cases.items():
        r = fleet.fleet("publish", *args, check=False)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), \
            (args, r.stderr)
    # a dry run reads the boxes back and shows the waves, and changes nothing either
    rc, data, err = fleet.publish("1.5.0", "--dry-run", "--waves", "1,2,rest")
    assert rc == 0, err
    assert [len(w) for w in data["waves"]] == [1, 2, 1] and data["switched_now"] == []
    assert {row["state"] for row in data["boxes"]} == {"untouched"}
    assert Registry(fleet.tmp / "state" / "boxes.json").rows() == registry
    assert not list(fleet.store.glob("*/publish.json"))
    assert {x: fleet.node(x) for x in labels} == before
    fleet.fleet("destroy", oneshot)
