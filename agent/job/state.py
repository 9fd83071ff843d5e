"""A job's state, `JOBDIR/state.json`: read, replaced durably, and changed under the job's lock.

Each step holds `JOBDIR/.lock` while it changes the state. A refusal is recorded here
(`phase: refused`), and so is a stop before the run (`phase: interrupted`); both write
`JOBDIR/outcome.json` (outside the work directory: nothing of the agent's is ever written among
the job's outputs) and remove the store token.
"""

from __future__ import annotations

import fcntl
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from agent.base.errors import AgentError
from agent.base.files import read_json, write_json
from agent.base.journal import utc
from agent.contract import (
    ADMITTED,
    FAILED,
    FETCHED,
    FINISHED,
    GATED,
    INTERRUPTED,
    JOB_STOP,
    NEW,
    REFUSED,
    RUNNING,
    SCANNED,
    TOKEN,
    TOKEN_UPLOAD,
    JobStateDoc,
    JobStateFile,
)
from agent.job import domain, jobuser
from agent.job.model import Job, Refused, now

RANK = {NEW: 0, ADMITTED: 1, FETCHED: 2, SCANNED: 3, GATED: 4, RUNNING: 5,
        FINISHED: 6, FAILED: 6, INTERRUPTED: 6}
TOKEN_FILES = (TOKEN, TOKEN_UPLOAD)  # the store token, and a deploy's upload of it
LOCK_POLL_S = 0.1


def fresh_state(job: Job) -> dict[str, Any]:
    """A new job's state.json (`agent.contract.JobStateFile`); the steps change it as a dict."""
    state: JobStateFile = {
        "name": job.name, "phase": NEW, "refused": None, "admission": None,
        "toolchain": None, "scan": None, "gates": None, "invocations": 0, "exit_code": None,
        "started_at": None, "finished_at": None, "timed_out": False, "interrupted": None,
        "runner": None, "process": None, "gating": None, "stopped": None,
        "steps": {}, "step": None, "killed": None, "strays": 0, "cgroups": [],
        "mark": domain.new_mark()}
    return cast(dict[str, Any], state)


def load_state(job: Job) -> dict[str, Any]:
    raw = read_json(job.state_path)
    if raw is None:
        if job.state_path.exists():
            raise AgentError(f"{job.state_path} is unreadable or not JSON; not guessing what "
                             "happened (look at it, then remove it to start the job over)")
        return fresh_state(job)
    if not isinstance(raw, dict) or raw.get("phase") not in (*RANK, REFUSED):
        raise AgentError(f"{job.state_path} is not a job state")
    return {**fresh_state(job), **raw}


def save_state(job: Job, state: dict[str, Any]) -> None:
    """Durably: a step is done (and a run intended) only once this returns."""
    try:
        write_json(job.state_path, state, durable=True)
    except OSError as e:
        raise AgentError(f"cannot record the job's state in {job.state_path}: "
                         f"{e.strerror or e}") from None


def write_outcome(job: Job, state: dict[str, Any]) -> None:
    """JOBDIR/outcome.json: what happened, in the job directory, never among the job's outputs
    (an output may carry any name). The outputs folder is made, empty where the job wrote
    nothing, so that the operator always has one to read back."""
    outcome = {"job": job.name, "phase": state["phase"], "invocations": state["invocations"],
               "refused": state["refused"], "admission": state["admission"],
               "gates": state["gates"], "exit_code": state["exit_code"],
               "timed_out": state["timed_out"], "interrupted": state["interrupted"],
               "stopped": state["stopped"], "started_at": state["started_at"],
               "finished_at": state["finished_at"], "killed": state.get("killed")}
    try:
        job.outputs_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # something else stands there: the refusal that ends the job says so
    try:
        write_json(job.outcome_path, outcome, durable=True)
    except OSError as e:
        print(f"warning: cannot write {job.outcome_path}: {e.strerror or e}", file=sys.stderr)


@contextmanager
def locked(job: Job, timeout: float | None = None) -> Iterator[None]:
    """JOBDIR/.lock, held while a step changes the state (the kernel drops it on any death);
    with a timeout, an AgentError when a step holds it that long."""
    fd = os.open(job.dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            until = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= until:
                        raise AgentError(f"job {job.name}: a step still holds {job.dir}/.lock "
                                         f"after {timeout:.0f} s") from None
                    time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)


def stop_requested(job: Job) -> dict[str, Any] | None:
    """`JOBDIR/stop.json` ({by, at, grace_s}), written by `job stop`, or None."""
    path = job.dir / JOB_STOP
    raw = read_json(path)
    if raw is None and (path.exists() or path.is_symlink()):
        raw = {"by": "operator", "at": None, "grace_s": None}  # unreadable: still a stop
    return raw if isinstance(raw, dict) else None


def stopped_marker(job: Job, phase: str) -> dict[str, Any] | None:
    """What `stopped` records: the stop asked for, and the phase it found the job in."""
    request = stop_requested(job)
    return None if request is None else {**request, "phase": phase}


def close(job: Job, state: dict[str, Any]) -> None:
    """A job stopped before its run: ended without running (invocations stay 0)."""
    was = state["phase"]
    kill_strays(state)
    state.update(phase=INTERRUPTED, gating=None, stopped=stopped_marker(job, was),
                 interrupted={"at": now(), "reason": f"stopped by the operator before it ran "
                                                     f"(it was {was})"})
    save_state(job, state)
    write_outcome(job, state)
    drop_token(job, strict=False)


def drop_token(job: Job, strict: bool = True) -> None:
    """Remove the store token from the box; Refused (strict) when it cannot be removed."""
    for name in TOKEN_FILES:
        path = job.root / name
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            if strict:
                raise Refused(f"the store token {path} cannot be removed ({e.strerror or e}); "
                              "the job's code never runs while it is on the box") from None


def with_deadline(job: Job, state: dict[str, Any]) -> JobStateDoc:
    """The state as printed, with `deadline_at` (UTC ISO, by this box's clock): when what the
    job does now must end. Each part of the job counts from its own start, as this agent
    recorded it, never from the rent: the run from its `started_at`, a gate that runs from its
    own start (each gate may take a full ttl), any other step that runs (a cold fetch, the
    scan) from that step's start, and a job between steps from the end of its last step, or
    the start of one that died without recording its end (the next step must start within a
    ttl). Each gets the job's ttl. None when the job has ended,
    was refused, or has had no step yet (the rent's deadline then holds, on the operator's
    side)."""
    from agent.base import procs

    started: Any = None
    gating, step = state.get("gating"), state.get("step")
    if gating is not None and procs.from_record(gating) is None:
        gating = None  # its gate (and the step that ran it) died: the job is between steps
    if step is not None and procs.from_record(step) is None:
        step = None
    if state["phase"] == RUNNING:
        started = state.get("started_at")
    elif isinstance(gating, dict):
        started = gating.get("started_at")
    elif isinstance(step, dict):
        started = step.get("started_at")
    elif state["phase"] in RANK and state["phase"] not in (FINISHED, FAILED, INTERRUPTED):
        # the last step's end (or its start, where it died without recording an end)
        marks = [_epoch(r.get(k)) for r in (state.get("steps") or {}).values()
                 if isinstance(r, dict) for k in ("started_at", "ended_at")]
        started = max((m for m in marks if m is not None), default=None)
    at = _epoch(started)
    return cast(JobStateDoc, {**state, "gating": gating, "step": step,
                              "deadline_at": None if at is None else utc(at + job.ttl_s)})


def _epoch(value: Any) -> float | None:
    """A recorded time: Unix seconds (what the agent writes) or UTC ISO (a hand edit)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        from datetime import UTC, datetime

        try:
            t = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
    return None


def kill_strays(state: dict[str, Any]) -> str | None:
    """Kill what a dead step or runner of this job left behind (the cgroups it recorded, every
    process of the job's user, and agent.job.domain's mark), counted in `strays`; what could
    not be ended (also recorded as `domain_problem`), or None. Before admission the job's uid
    is not yet this job's: nothing of it is killed then."""
    killed, problem = domain.kill_cgroups(state)
    killed += domain.kill_marked(str(state.get("mark")))
    if state["phase"] != NEW:
        killed += jobuser.sweep()
    state["strays"] = int(state.get("strays") or 0) + killed
    if problem is not None:
        state["domain_problem"] = problem
    return problem


def refuse(job: Job, state: dict[str, Any], step: str, reason: str) -> None:
    kill_strays(state)
    state.update(phase=REFUSED, refused={"step": step, "reason": reason}, gating=None)
    save_state(job, state)
    write_outcome(job, state)
    drop_token(job, strict=False)  # no later step will fetch
