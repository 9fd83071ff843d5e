"""`job stop JOBDIR [--grace S]`: end the job now, with its end recorded, whatever its phase.

The operator stops a job before reading its outputs (a teardown past the box's deadline), so
that nothing writes to them while they are read and no step starts after the read:
1. an ended or refused job is printed and nothing changes;
2. otherwise `JOBDIR/stop.json` ({by, at, grace_s}) is written first: every step and the runner
   look for it under the job's lock, so none starts anything after it;
3. a gate that runs (it holds the lock) gets SIGTERM to its process group, SIGKILL after the
   grace; its step then closes the job;
4. under the lock, a job that never ran is closed (`phase: interrupted`, invocations 0); a run
   whose runner is gone is recorded as interrupted; a live run's command group gets SIGTERM,
   SIGKILL after the grace, and the runner records its end (`finished` or `failed`).
Every ending records `stopped: {by, at, grace_s, phase}` (the phase the stop found). The state
is printed once the end is recorded; a stop that cannot see it recorded is an error (exit 1).
"""

from __future__ import annotations

import math
import signal
import time
from typing import Any

from agent.base import procs
from agent.base.errors import AgentError, usage_error
from agent.base.files import write_json
from agent.contract import JOB_STOP, RUNNING, TERMINAL, stop_document
from agent.job.model import Job, now
from agent.job.run import interrupt, runner_alive, settle
from agent.job.state import close, load_state, locked, stop_requested

END_WAIT_S = 60.0  # after the KILL: the runner records the end within this
LOCK_WAIT_S = 60.0  # beyond the grace: a step other than a gate finishes within this
POLL_S = 0.1


def stop(job: Job, grace: float) -> dict[str, Any]:
    if not (math.isfinite(grace) and grace >= 0):
        raise usage_error(f"--grace must be a finite number of seconds >= 0, got {grace}")
    state = load_state(job)
    if _over(state):
        return state
    if stop_requested(job) is None:
        write_json(job.dir / JOB_STOP, dict(stop_document(now(), grace)), durable=True)
    _end(job, "gating", grace)  # the gate step closes the job once its gate has ended
    try:
        with locked(job, timeout=grace + LOCK_WAIT_S):
            state = load_state(job)
            if _over(state):
                return state
            if state["phase"] != RUNNING:
                close(job, state)
                return state
            if not runner_alive(state):
                interrupt(job, state)
                return state
    except AgentError as e:
        raise AgentError(f"{e}; the stop is recorded and the step closes the job when it "
                         "ends") from None
    _end(job, "process", grace)
    until = time.monotonic() + END_WAIT_S
    while time.monotonic() < until:
        state = settle(job)
        if state["phase"] != RUNNING:
            return state
        time.sleep(POLL_S)
    raise AgentError(f"job {job.name}: its command was killed but its end is not recorded "
                     f"after {END_WAIT_S:.0f} s (see {job.log})")


def _over(state: dict[str, Any]) -> bool:
    return state["phase"] in TERMINAL


def _end(job: Job, key: str, grace: float) -> None:
    """SIGTERM the process group that `state[key]` names (the command, or the gate that runs),
    SIGKILL after the grace; until the state no longer names a live one."""
    sent: dict[tuple[int, int], int] = {}
    killed_at = time.monotonic() + grace
    until = killed_at + END_WAIT_S
    while time.monotonic() < until:
        state = settle(job)
        record = state.get(key)
        proc = procs.from_record(record)
        if _over(state):
            return
        if proc is None or not isinstance(record, dict):
            if key == "process" and state["phase"] == RUNNING and record is None:
                time.sleep(POLL_S)  # the runner is about to name its command (or see the stop)
                continue
            return
        sig = signal.SIGKILL if time.monotonic() >= killed_at else signal.SIGTERM
        if sent.get((proc.pid, proc.start_ticks)) != sig:
            pgid = record.get("pgid")
            procs.signal_program(proc.pid, pgid if isinstance(pgid, int) else proc.pid, sig)
            sent[(proc.pid, proc.start_ticks)] = sig
        time.sleep(POLL_S)
