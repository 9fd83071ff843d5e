"""`job run`: the job's command, once, detached from the SSH session that asked for it.

Order of events, each recorded durably before the next:
1. under the job's lock: a stop asked for closes the job; the store token is removed (a
   refusal when it cannot be); the outputs folder must be one the runner can make (nothing
   but a folder at `outputs` or on its way: agent.job.inputs); every scanned module must
   still have its recorded sha256; and
   admission is checked again (the driver may have changed since `admit`); a refusal here is
   recorded like any other and nothing starts;
2. the intent: `phase: running`, `invocations: 1`, `started_at` (nothing may run unrecorded);
3. the runner, `python -m agent job runner JOBDIR`, in its own session (setsid) with stdin from
   /dev/null and its output appended to `JOBDIR/job.log`, so that a dropped connection cannot
   reach it; its identity (pid, start ticks, boot id: agent.base.procs) goes into the state;
4. the runner takes the lock, checks that the state names it and that no stop was asked for,
   starts `sh -c <command>` in workdir/ (its own process group) and records the command's
   identity;
5. when the command ends (or is killed at the job's ttl), the runner records its exit status,
   `finished_at` and `phase: finished|failed`, writes `JOBDIR/outcome.json`, and
   kills whatever the command left behind, in any session (the runner is its kill domain,
   agent.job.domain), recording how many (`killed`); a stop asked for
   (`job stop`, which TERMs and then KILLs the command's group) is recorded as `stopped`.

A runner that is gone while the state still says running (a reboot, a SIGKILL) can never record
the end: whoever looks next (`job run`, `job state`) records `phase: interrupted`, kills what is
left of the command, and writes outcome.json. Nothing is ever run a second time.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import agent
from agent.base import procs
from agent.base.errors import AgentError, usage_error
from agent.base.journal import utc
from agent.contract import ENDED, FAILED, FINISHED, GATED, INTERRUPTED, REFUSED, RUNNING
from agent.job import domain, jobuser
from agent.job.admit import check_admission
from agent.job.inputs import outputs_place
from agent.job.model import Job, Refused, load_job, now
from agent.job.state import (
    RANK,
    close,
    drop_token,
    kill_strays,
    load_state,
    locked,
    refuse,
    save_state,
    stop_requested,
    stopped_marker,
    write_outcome,
)

POLL_S = 1.0  # --wait looks at least this often (and at once when the runner exits)
KILL_GRACE_S = 10.0  # at the ttl: SIGTERM to the command's group, SIGKILL after this
AGENT_HOME = Path(agent.__file__).resolve().parent.parent  # where `-m agent` is found


def run(job: Job, wait: bool) -> tuple[dict[str, Any], int]:
    """Start the job (or adopt the running one, or read the ended one); with `wait`, until it
    has ended. Exit status: 0, or with `wait` 0 only when the command exited 0."""
    child: subprocess.Popen[bytes] | None = None
    with locked(job):
        state = load_state(job)
        phase = state["phase"]
        if phase == REFUSED:
            return state, 0
        if phase == RUNNING:
            if not runner_alive(state):
                interrupt(job, state)
        elif phase not in ENDED:
            if RANK[phase] < RANK[GATED]:
                raise usage_error(f"job {job.name}: the gates have not passed yet (the job is "
                                  f"{phase}); the steps are admit, fetch, scan, gate, run")
            if stop_requested(job):
                close(job, state)
                return state, 0
            refusal = _last_checks(job, state)
            if refusal is not None:
                refuse(job, state, *refusal)
                return state, 0
            child = _start(job, state)
    if wait and state["phase"] == RUNNING:
        state = _wait(job, state, child)
    if not wait:
        return state, 0
    return state, 0 if state["phase"] == FINISHED else 1


def _last_checks(job: Job, state: dict[str, Any]) -> tuple[str, str] | None:
    """(step, reason) when the job may not start now, else None."""
    from agent.job.scan import check_digests

    try:
        drop_token(job)
    except Refused as r:
        return "token", r.reason
    taken = outputs_place(job.work, job.outputs)  # the runner could not make the folder
    if taken is not None:
        return "outputs", taken
    changed = check_digests(job, state.get("scan"))
    if changed is not None:
        return "scan", changed
    admission = check_admission(job)
    state["admission"] = admission
    return None if admission["admitted"] else ("gpu", admission["reason"])


def _start(job: Job, state: dict[str, Any]) -> subprocess.Popen[bytes] | None:
    state.update(phase=RUNNING, invocations=1, started_at=now(), runner=None, process=None)
    save_state(job, state)  # the intent, before anything starts
    try:
        out = os.open(job.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "agent", "job", "runner", str(job.dir)],
                env=domain.environment(state["mark"]), cwd=AGENT_HOME,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True)
        finally:
            os.close(out)
    except OSError as e:
        interrupt(job, state, f"the runner could not be started: {e.strerror or e}")
        return None
    ticks = procs.start_ticks_of(child.pid)
    state["runner"] = {"pid": child.pid, "start_ticks": ticks if ticks is not None else -1,
                       "boot_id": procs.boot_id()}
    save_state(job, state)
    return child


def runner_alive(state: dict[str, Any]) -> bool:
    return procs.from_record(state.get("runner")) is not None


def interrupt(job: Job, state: dict[str, Any], reason: str | None = None) -> None:
    """Record that the run ended without its end being recorded; kill what is left of it."""
    command = procs.from_record(state.get("process"))
    if command is not None:
        procs.signal_program(command.pid, command.pgid, signal.SIGKILL)
    kill_strays(state)  # what the command started in other groups or sessions
    runner = state.get("runner") or {}
    why = reason or (f"the runner (pid {runner.get('pid')}) is gone without recording the end "
                     "(a reboot or a kill); the command's exit status is unknown")
    state.update(phase=INTERRUPTED, interrupted={"at": now(), "reason": why},
                 stopped=stopped_marker(job, RUNNING) or state.get("stopped"))
    save_state(job, state)
    write_outcome(job, state)


def settle(job: Job) -> dict[str, Any]:
    """The state, with a vanished runner recorded as an interrupted run (for `job state`
    and the --wait loop; takes the lock only then)."""
    state = load_state(job)
    if state["phase"] != RUNNING or runner_alive(state):
        return state
    with locked(job):
        state = load_state(job)
        if state["phase"] == RUNNING and not runner_alive(state):
            interrupt(job, state)
    return state


def _wait(job: Job, state: dict[str, Any],
          child: subprocess.Popen[bytes] | None) -> dict[str, Any]:
    runner = state.get("runner") or {}
    fd = procs.pidfd(runner["pid"]) if isinstance(runner.get("pid"), int) else None
    try:
        while True:
            if child is not None:
                child.poll()  # our own runner: reap it once it has exited
            state = settle(job)
            if state["phase"] != RUNNING:
                return state
            if fd is not None:
                select.select([fd], [], [], POLL_S)  # readable once the runner has exited
            else:
                time.sleep(POLL_S)
    finally:
        if fd is not None:
            os.close(fd)


# ---------------------------------------------------------------------------- the runner


def runner_main(jobdir: Path) -> int:
    """`python -m agent job runner JOBDIR` (started by `job run` only)."""
    job = load_job(jobdir)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        domain.enter()  # the command's orphans come to us, and are killed at its end
    except domain.DomainError as e:
        with locked(job):
            state = load_state(job)
            if state["phase"] == RUNNING and (state.get("runner") or {}).get("pid") == os.getpid():
                interrupt(job, state, f"the command was not started: {e}")
        return 1
    with locked(job):
        state = load_state(job)
        me = state.get("runner") or {}
        if state["phase"] != RUNNING or me.get("pid") != os.getpid() or state["process"]:
            print(f"runner {os.getpid()}: the job's state does not name this runner "
                  f"(phase {state['phase']}); nothing started", flush=True)
            return 1
        if stop_requested(job):
            interrupt(job, state, "stopped by the operator before the command started")
            return 0
        job.outputs_dir.mkdir(parents=True, exist_ok=True)  # the command writes its outputs here
        print(f"--- {utc()} job {job.name}: {job.command}", flush=True)
        dom = domain.open_domain(job.name, "run", state, lambda: save_state(job, state))
        state["steps"] = {**(state.get("steps") or {}),
                          "run": {"domain": dom.kind, "cgroup": dom.cgroup, "clean": None}}
        try:
            child = subprocess.Popen(["/bin/sh", "-c", job.command], cwd=job.work,
                                     stdin=subprocess.DEVNULL, process_group=0,
                                     **jobuser.popen_kwargs(job, os.environ, dom.preexec()))
        except (OSError, subprocess.SubprocessError) as e:
            _close_quietly(dom, state)
            interrupt(job, state, f"the command could not be started: {e}")
            return 1
        ticks = procs.start_ticks_of(child.pid)
        state["process"] = {"pid": child.pid, "start_ticks": ticks if ticks is not None else -1,
                            "boot_id": procs.boot_id(), "pgid": child.pid}
        try:
            save_state(job, state)
        except AgentError:
            _close_quietly(dom, state)  # never leave a command running the state does not name
            raise
    started_at = float(state["started_at"] or time.time())
    code, timed_out = _supervise(child, started_at + job.ttl_s)
    with locked(job):
        state = load_state(job)
        record = (state.get("steps") or {}).get("run") or {}
        try:
            killed, problem = dom.close(state), None
        except domain.DomainError as e:
            killed, problem = 0, f"what the command started could not be ended: {e}"
        record.update(clean=problem is None, killed=killed, **({"problem": problem}
                                                                if problem else {}))
        state["steps"] = {**(state.get("steps") or {}), "run": record}
        print(f"--- {utc()} exit {code}" + (" (killed at the job's ttl)" if timed_out else "")
              + (f" ({problem})" if problem else ""), flush=True)
        state.update(phase=FINISHED if code == 0 and not timed_out and problem is None
                     else FAILED,
                     exit_code=code, finished_at=now(), timed_out=timed_out, killed=killed,
                     stopped=stopped_marker(job, RUNNING))
        if problem:
            state["domain_problem"] = problem
        save_state(job, state)
        write_outcome(job, state)
    return 0


def _close_quietly(dom: domain.Domain, state: dict[str, Any]) -> None:
    """End the domain on a path that already fails; what cannot be ended is left to the strays
    sweep (its cgroup stays recorded)."""
    try:
        dom.close(state)
    except domain.DomainError as e:
        state["domain_problem"] = str(e)


def _supervise(child: subprocess.Popen[bytes], deadline: float) -> tuple[int, bool]:
    """Wait for the command; at the deadline (wall clock: the ttl counts from the recorded
    start), TERM its group, then KILL it after a grace."""
    try:
        return child.wait(timeout=max(0.0, deadline - time.time())), False
    except subprocess.TimeoutExpired:
        pass
    procs.signal_program(child.pid, child.pid, signal.SIGTERM)
    try:
        return child.wait(timeout=KILL_GRACE_S), True
    except subprocess.TimeoutExpired:
        procs.signal_program(child.pid, child.pid, signal.SIGKILL)
        return child.wait(), True
