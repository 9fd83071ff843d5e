"""Every step of a one-shot job runs in its own kill domain: whatever a gate or the run starts,
even in a session of its own (setsid), is dead when the step ends, is refused or is stopped, and
the step's record says how many processes it killed. Here on a box without cgroup v2 (the
subreaper and the job's mark; the cgroup domain: test_agent_job_cgroup)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from agentbox import PY, Box, wait_for
from jobtools import JOB_PY, NO_CGROUP_V2, job, state_of, step_ok, workdir, write_job

from agent.base import procs

# a daemon in a session of its own, its pid in workdir/daemon.pid before the gate goes on (the
# system's python3: the job's user may not reach the test's own interpreter)
DAEMON = (f"{JOB_PY} -c \"import subprocess; d = subprocess.Popen(['sleep', '600'], "
          "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
          "stderr=subprocess.DEVNULL); open('daemon.pid', 'w').write(str(d.pid))\"")


@pytest.fixture(autouse=True)
def without_cgroup_v2(box: Box) -> None:
    box.wrap = NO_CGROUP_V2


def daemon_alive(jobdir: Path) -> bool:
    pid = int((workdir(jobdir) / "daemon.pid").read_text())
    info = procs.identify(pid)
    return info is not None and info.argv[:2] == ("sleep", "600")


def through(box: Box, jobdir: Path, *steps: str) -> None:
    for step in steps:
        step_ok(box, step, jobdir)


def test_a_gates_daemon_in_its_own_session_dies_with_the_gate(box: Box) -> None:
    jobdir = write_job(box, gates=[{"name": "g", "command": f"{DAEMON}; echo '1 passed in 0.1s'",
                                    "min_passed": 1}])
    through(box, jobdir, "admit", "fetch", "scan")
    state = step_ok(box, "gate", jobdir)
    assert state["phase"] == "gated"
    assert not daemon_alive(jobdir)
    assert state["gates"][0]["killed"] == 1


def test_a_refused_gates_daemon_dies_and_nothing_ran(box: Box) -> None:
    jobdir = write_job(box, gates=[{"name": "g", "command": f"{DAEMON}; echo '1 failed in 0.1s'",
                                    "min_passed": 1}])
    through(box, jobdir, "admit", "fetch", "scan")
    done = job(box, "gate", jobdir)
    assert done.returncode == 3, done.stderr
    state = state_of(done)
    assert state["phase"] == "refused" and state["invocations"] == 0
    assert not daemon_alive(jobdir)
    assert state["gates"][0]["killed"] == 1


def test_a_stopped_gates_daemon_dies(box: Box) -> None:
    jobdir = write_job(box, gates=[{"name": "g", "command": f"{DAEMON}; touch gating; sleep 600",
                                    "min_passed": 1}])
    through(box, jobdir, "admit", "fetch", "scan")
    gating = subprocess.Popen([*box.wrap, PY, "-m", "agent", "job", "gate", str(jobdir)],
                              env=box.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (workdir(jobdir) / "gating").exists(), "the gate started")
        assert daemon_alive(jobdir)
        done = job(box, "stop", jobdir, "--grace", "1")
        assert done.returncode == 0, done.stderr
        assert gating.wait(timeout=60) == 0
    finally:
        gating.kill()
        gating.wait()
    assert not daemon_alive(jobdir)
    assert state_of(job(box, "state", jobdir))["phase"] == "interrupted"


def test_the_runs_daemon_dies_at_its_end_and_the_record_counts_it(box: Box) -> None:
    jobdir = write_job(box, command=f"{DAEMON}; echo ran >> runs.txt")
    through(box, jobdir, "admit", "fetch", "scan", "gate")
    done = job(box, "run", jobdir, "--wait")
    assert done.returncode == 0, done.stderr
    state = state_of(done)
    assert state["phase"] == "finished" and not daemon_alive(jobdir)
    assert state["killed"] == 1


def test_every_step_records_its_domain(box: Box) -> None:
    jobdir = write_job(box)
    through(box, jobdir, "admit", "fetch", "scan", "gate")
    state = step_ok(box, "state", jobdir)
    for step in ("admit", "fetch", "scan", "gate"):
        domain = state["steps"][step]
        assert domain["domain"] == "subreaper" and domain["killed"] == 0, (step, domain)
        assert domain["started_at"] <= domain["ended_at"]


def test_what_a_killed_gate_step_left_behind_dies_at_the_stop(box: Box) -> None:
    jobdir = write_job(box, gates=[{"name": "g", "command": f"{DAEMON}; touch gating; sleep 600",
                                    "min_passed": 1}])
    through(box, jobdir, "admit", "fetch", "scan")
    gating = subprocess.Popen([*box.wrap, PY, "-m", "agent", "job", "gate", str(jobdir)],
                              env=box.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (workdir(jobdir) / "gating").exists(), "the gate started")
        gate = wait_for(lambda: state_of(job(box, "state", jobdir))["gating"], "the gate named")
    finally:
        gating.kill()  # the step dies (a dropped deploy, a KILL): it can clean nothing up
        gating.wait()
    os.killpg(gate["pgid"], signal.SIGKILL)  # and its gate's group with it
    assert daemon_alive(jobdir)  # in its own session: reparented away from the dead step
    done = job(box, "stop", jobdir, "--grace", "1")
    assert done.returncode == 0, done.stderr
    state = state_of(done)
    assert state["phase"] == "interrupted" and state["invocations"] == 0
    assert not daemon_alive(jobdir)
    assert state["strays"] == 1


def test_what_a_killed_runner_left_behind_dies_when_the_run_is_found_interrupted(
        box: Box) -> None:
    jobdir = write_job(box, command=f"{DAEMON}; touch started; sleep 600")
    through(box, jobdir, "admit", "fetch", "scan", "gate")
    step_ok(box, "run", jobdir)
    wait_for(lambda: (workdir(jobdir) / "started").exists(), "the command started")
    state = step_ok(box, "state", jobdir)
    os.kill(state["runner"]["pid"], signal.SIGKILL)  # a runner killed: no end recorded
    os.killpg(state["process"]["pgid"], signal.SIGKILL)
    assert daemon_alive(jobdir)
    after = wait_for(lambda: (lambda s: s if s["phase"] == "interrupted" else None)(
        step_ok(box, "state", jobdir)), "the run found interrupted")
    assert after["invocations"] == 1 and not daemon_alive(jobdir)
    assert after["strays"] == 1
