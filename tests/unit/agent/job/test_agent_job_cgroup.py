"""On a box with cgroup v2, each step's job code runs in a cgroup of its own: what a gate or the
run starts dies with it even when it leaves its session and clears its environment (where the
subreaper and the job's mark lose it once the step is gone), the record says `domain: cgroup`
and how many it killed, and a cgroup that cannot be ended is never reported clean. Without a
writable cgroup v2 the step falls back to its subreaper and says so."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from agentbox import PY, Box, wait_for
from jobtools import (
    CGROUP_V2,
    NO_CGROUP_V2,
    READ_ONLY_CGROUP_V2,
    job,
    state_of,
    step_ok,
    workdir,
    write_job,
)

from agent.base import procs

# a daemon in a session of its own with an empty environment (no mark), its pid in
# workdir/daemon.pid before the gate goes on (a script: a gate's command is read strictly)
DAEMON = "python3 daemon.py"
DAEMON_PY = """
import os, time
if os.fork() == 0:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    with open("daemon.pid.new", "w") as f:
        f.write(str(os.getpid()))
    os.rename("daemon.pid.new", "daemon.pid")
    os.execve("/bin/sleep", ["sleep", "600"], {})
while not os.path.exists("daemon.pid"):
    time.sleep(0.05)
"""
# the gate tells its cgroup and waits to be pinned (root does it from outside: the job's own
# user may not mount): a mount on a cgroup made inside the step's cannot be removed from that
# namespace, and /dev/null over its cgroup.kill makes that file do nothing
PIN_PY = """
import os, time
own = next(line[3:] for line in open("/proc/self/cgroup").read().splitlines()
           if line.startswith("0::"))
with open("cg.new", "w") as f:
    f.write(f"{os.getpid()} {own}")
os.rename("cg.new", "cg.txt")
deadline = time.monotonic() + 60
while not os.path.exists("pinned") and time.monotonic() < deadline:
    time.sleep(0.05)
"""
PIN = ('cg=/sys/fs/cgroup$1; mkdir "$cg/pin" && mount -t tmpfs none "$cg/pin" && '
       'mount --bind /dev/null "$cg/cgroup.kill"')


def daemon_alive(jobdir: Path) -> bool:
    pid = int((workdir(jobdir) / "daemon.pid").read_text())
    info = procs.identify(pid)
    return info is not None and info.argv[:2] == ("sleep", "600")


def in_v2(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CGROUP_V2, *argv], capture_output=True, text=True, timeout=60)


def cgroup_exists(rel: str) -> bool:
    return in_v2("test", "-d", f"/sys/fs/cgroup{rel}").returncode == 0


def gate_job(box: Box, command: str) -> Path:
    jobdir = write_job(box, gates=[{"name": "g", "command": command, "min_passed": 1}])
    (workdir(jobdir) / "daemon.py").write_text(DAEMON_PY)
    (workdir(jobdir) / "pin.py").write_text(PIN_PY)
    for step in ("admit", "fetch", "scan"):
        step_ok(box, step, jobdir)
    return jobdir


def test_a_gates_daemon_without_session_or_environment_dies_in_its_cgroup(box: Box) -> None:
    box.wrap = CGROUP_V2
    jobdir = gate_job(box, f"{DAEMON}; echo '1 passed in 0.1s'")
    state = step_ok(box, "gate", jobdir)
    assert state["phase"] == "gated"
    assert not daemon_alive(jobdir)
    record = state["steps"]["gate"]
    assert record["domain"] == "cgroup" and record["clean"] is True, record
    assert state["gates"][0]["killed"] == 1
    assert not cgroup_exists(record["cgroup"]) and state["cgroups"] == []


def test_every_step_on_a_cgroup_v2_box_records_its_cgroup(box: Box) -> None:
    box.wrap = CGROUP_V2
    jobdir = gate_job(box, "echo '1 passed in 0.1s'")
    state = step_ok(box, "gate", jobdir)
    for step in ("admit", "fetch", "scan", "gate"):
        record = state["steps"][step]
        assert record["domain"] == "cgroup" and record["killed"] == 0, (step, record)
        assert record["cgroup"].rsplit("/", 1)[-1].startswith(f"fleet-job-bench-{step}-")


def test_what_a_killed_gate_step_left_in_its_cgroup_dies_at_the_stop(box: Box) -> None:
    box.wrap = CGROUP_V2
    jobdir = gate_job(box, f"{DAEMON}; touch gating; sleep 600")
    gating = subprocess.Popen([*CGROUP_V2, PY, "-m", "agent", "job", "gate", str(jobdir)],
                              env=box.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_for(lambda: (workdir(jobdir) / "gating").exists(), "the gate started")
        gate = wait_for(lambda: state_of(job(box, "state", jobdir))["gating"], "the gate named")
        step = state_of(job(box, "state", jobdir))["step"]
    finally:
        os.kill(step["pid"], signal.SIGKILL)  # the step dies: it can clean nothing up
        gating.wait()
    os.killpg(gate["pgid"], signal.SIGKILL)  # and its gate's group with it
    assert daemon_alive(jobdir)  # no session, no mark, no parent of the job's: only its cgroup
    done = job(box, "stop", jobdir, "--grace", "1")
    assert done.returncode == 0, done.stderr
    state = state_of(done)
    assert state["phase"] == "interrupted" and state["invocations"] == 0
    assert not daemon_alive(jobdir)
    assert state["strays"] == 1 and state["cgroups"] == []


def test_the_runs_daemon_dies_in_its_cgroup_and_the_record_counts_it(box: Box) -> None:
    box.wrap = CGROUP_V2
    jobdir = write_job(box, command=f"{DAEMON}; echo ran >> runs.txt")
    (workdir(jobdir) / "daemon.py").write_text(DAEMON_PY)
    for step in ("admit", "fetch", "scan", "gate"):
        step_ok(box, step, jobdir)
    done = job(box, "run", jobdir, "--wait")
    assert done.returncode == 0, done.stderr
    state = state_of(done)
    assert state["phase"] == "finished" and not daemon_alive(jobdir)
    assert state["killed"] == 1
    record = state["steps"]["run"]
    assert record["domain"] == "cgroup" and record["clean"] is True and record["killed"] == 1
    assert not cgroup_exists(record["cgroup"])


@pytest.mark.parametrize("view", [NO_CGROUP_V2, READ_ONLY_CGROUP_V2], ids=["none", "read-only"])
def test_without_a_writable_cgroup_v2_each_step_falls_back_to_its_subreaper(
        box: Box, view: list[str]) -> None:
    box.wrap = view
    jobdir = gate_job(box, f"{DAEMON}; echo '1 passed in 0.1s'")
    state = step_ok(box, "gate", jobdir)
    assert not daemon_alive(jobdir) and state["gates"][0]["killed"] == 1
    for step in ("admit", "fetch", "scan", "gate"):
        record = state["steps"][step]
        assert record["domain"] == "subreaper" and record["cgroup"] is None, (step, record)
        assert record["clean"] is True


def test_a_cgroup_that_cannot_be_removed_is_not_clean_and_the_job_goes_no_further(
        box: Box) -> None:
    box.wrap = CGROUP_V2
    jobdir = gate_job(box, f"{DAEMON}; python3 pin.py; echo '1 passed in 0.1s'")
    rel = None
    try:
        gate = subprocess.Popen([*box.wrap, PY, "-m", "agent", "job", "gate", str(jobdir)],
                                env=box.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        told = workdir(jobdir) / "cg.txt"
        wait_for(told.exists, "the gate told its cgroup")
        pid, own = told.read_text().split()
        pinned = subprocess.run(["nsenter", "-t", pid, "-m", "sh", "-c", PIN, "sh", own],
                                capture_output=True, text=True, timeout=60)
        assert pinned.returncode == 0, pinned.stderr
        (workdir(jobdir) / "pinned").touch()
        out, err = gate.communicate(timeout=120)
        done = subprocess.CompletedProcess(gate.args, gate.returncode, out, err)
        assert done.returncode == 3, done.stderr
        state = state_of(done)
        rel = state["steps"]["gate"]["cgroup"]
        assert state["phase"] == "refused" and state["invocations"] == 0
        record = state["steps"]["gate"]
        assert record["clean"] is False and "cannot be removed" in record["problem"], record
        assert not daemon_alive(jobdir)  # killed by pid where cgroup.kill did nothing
        assert job(box, "run", jobdir).returncode == 3
    finally:
        if rel:
            in_v2("rmdir", f"/sys/fs/cgroup{rel}/pin", f"/sys/fs/cgroup{rel}")  # the pin
            # went with the namespace
