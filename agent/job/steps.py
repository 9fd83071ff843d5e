"""One-shot jobs on the box: `python -m agent job admit|fetch|scan|gate|run|state|stop JOBDIR`.

A one-shot box is rented for one measurement. The operator uploads `JOBDIR/job.json` and the
job's inputs (`JOBDIR/workdir/`), then calls the steps one at a time, in a fixed order that this
module enforces, failing closed:

    admit (driver, GPUs) -> fetch (toolchain) -> scan (modules) -> gate (gates) -> run

A refusal at any step is recorded (`phase: refused`, `refused: {step, reason}`, invocations 0,
`JOBDIR/outcome.json`) and every later step refuses too: a refused job never runs, and
its refusal is an operational fault, not a result. A step already done prints the state and
changes nothing; a step whose predecessor is not done is a usage error (exit 2).

The state lives in `JOBDIR/state.json`, replaced atomically and fsynced; each step holds
`JOBDIR/.lock` while it changes it. This module holds the order; the job file is model, the
state is state, and the steps live in admit, fetch (toolchain), scan (modules), gates, run and
stop. It imports neither huggingface_hub nor elftools: only the step that needs one imports it,
and each step module is imported only when its step is asked for.

The store token (`<root>/hf_token`) is for `fetch` alone: fetch removes it whatever its outcome,
so do a refusal and a stop, and `gate` and `run` remove it again before any of the job's code
starts (refusing when they cannot): the job's own code never runs while it is on the box.

`job stop` (stop) writes `JOBDIR/stop.json` before anything else; every step looks for it
under the lock and closes the job instead of going on (`phase: interrupted`, `stopped`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from agent.base import procs
from agent.base.errors import usage_error
from agent.contract import AFTER, BEFORE, EXIT_JOB_REFUSED, REFUSED, STEPS, JobStateDoc
from agent.job import domain, jobuser
from agent.job.admit import admit
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
    with_deadline,
)

# the step a refusal names in the state
STEP_NAMES = {"admit": "gpu", "fetch": "toolchain", "scan": "scan", "gate": "gates"}


def run_step(step: str, jobdir: Path, wait: bool = False,
             grace: float = 10.0) -> tuple[JobStateDoc, int]:
    """Do one step (or just read the state: `state`, or stop the job: `stop`); returns the
    state to print and the exit status. A refused job (now or before) is exit 3, with its
    reason on stderr (`state` and `stop` exit 0). Every state printed has `deadline_at`."""
    job = load_job(jobdir)
    state, code = _step(step, job, wait, grace)
    return with_deadline(job, state), code


def _step(step: str, job: Job, wait: bool, grace: float) -> tuple[dict[str, Any], int]:
    if step == "state":
        from agent.job.run import settle

        return settle(job), 0
    if step == "stop":
        from agent.job.stop import stop

        return stop(job, grace), 0
    if step == "run":
        from agent.job.run import run

        state, code = run(job, wait)
        return state, _refused_status(state, code)
    with locked(job):
        state = load_state(job)
        if state["phase"] == REFUSED:
            return state, _refused_status(state, 0)
        rank, wanted = RANK[state["phase"]], RANK[BEFORE[step]]
        if rank > wanted:
            return state, 0  # done already: no side effect
        if rank < wanted:
            raise usage_error(f"job {job.name}: {_missing(state['phase'])} first "
                              f"(the job is {state['phase']})")
        if stop_requested(job):
            close(job, state)
            return state, 0
        try:
            _in_domain(step, job, state)
        except Refused as r:
            refuse(job, state, STEP_NAMES.get(step, step), r.reason)
            return state, _refused_status(state, 0)
        if stop_requested(job):  # asked for while the step ran
            close(job, state)
            return state, 0
        state["phase"] = AFTER[step]
        save_state(job, state)
        return state, 0


def _in_domain(step: str, job: Job, state: dict[str, Any]) -> None:
    """The step in its own kill domain (agent.job.domain): whatever it started is dead when it
    returns, and `steps.<step>` records the domain, its start and end, how many it killed, and
    whether it ended clean (a domain that could not be emptied refuses the job)."""
    problem = kill_strays(state)  # what an earlier step that died left behind
    if problem is not None:
        raise Refused(f"what an earlier step left cannot be ended: {problem}")
    try:
        dom = domain.open_domain(job.name, step, state, lambda: save_state(job, state))
    except domain.DomainError as e:
        raise Refused(str(e)) from None
    started = now()
    record: dict[str, Any] = {"domain": dom.kind, "cgroup": dom.cgroup, "started_at": started,
                              "ended_at": None, "killed": 0, "clean": None}
    state["steps"] = {**(state.get("steps") or {}), step: record}
    state["step"] = {"name": step, "started_at": started, "pid": os.getpid(),
                     "start_ticks": procs.start_ticks_of(os.getpid()) or -1,
                     "boot_id": procs.boot_id()}
    save_state(job, state)  # `job state` tells this step's deadline from its start
    ended = False
    try:
        _STEPS[step](job, state, dom)
        ended = True
    finally:
        record["ended_at"] = now()
        state["step"] = None
        try:
            record["killed"] += dom.close(state)
            if step != "admit":  # from admission on, the job's uid is this job's alone
                record["killed"] += jobuser.sweep()
            record["clean"] = True
        except domain.DomainError as e:
            record.update(clean=False, problem=str(e))
            if ended:  # a refusal already raised stands; either way the job goes no further
                raise Refused(f"the step's kill domain did not end clean: {e}") from None


def _refused_status(state: dict[str, Any], code: int) -> int:
    if state["phase"] != REFUSED:
        return code
    refused = state["refused"] or {}
    print(f"refused: {refused.get('step')}: {refused.get('reason')}", file=sys.stderr)
    return EXIT_JOB_REFUSED


def _missing(phase: str) -> str:
    """What must happen next, for a job in this phase."""
    for step in STEPS:
        if BEFORE[step] == phase:
            return f"`job {step}`"
    return "nothing"


def _fetch_step(job: Job, state: dict[str, Any], dom: domain.Domain) -> None:
    from agent.job.fetch import fetch

    try:
        state["toolchain"] = fetch(job)
    finally:
        drop_token(job)  # fetch consumes the token: nothing after it may read it


def _scan_step(job: Job, state: dict[str, Any], dom: domain.Domain) -> None:
    from agent.job.scan import ScanRefused, scan_job

    try:
        state["scan"] = scan_job(job)
    except ScanRefused as e:
        state["scan"] = e.record
        raise Refused(e.reason) from None


def _gate_step(job: Job, state: dict[str, Any], dom: domain.Domain) -> None:
    from agent.job.gates import run_gates

    drop_token(job)  # a gate is the job's own code
    jobuser.hand_over(job)  # its inputs and outputs to the job's user, before any of its code
    state["gates"] = []
    failure = run_gates(job, state, dom)
    if failure:
        raise Refused(failure)


def _admit_step(job: Job, state: dict[str, Any], dom: domain.Domain) -> None:
    admit(job, state)


_STEPS = {"admit": _admit_step, "fetch": _fetch_step, "scan": _scan_step, "gate": _gate_step}
