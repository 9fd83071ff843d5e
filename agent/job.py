"""One-shot jobs on the box: `python -m agent job admit|fetch|scan|gate|run|state|stop JOBDIR`.

A one-shot box is rented for one measurement. The operator uploads `JOBDIR/job.json` and the
job's inputs (`JOBDIR/workdir/`), then calls the steps one at a time, in a fixed order that this
module enforces, failing closed:

    admit (driver, GPUs) -> fetch (toolchain) -> scan (modules) -> gate (gates) -> run

A refusal at any step is recorded (`phase: refused`, `refused: {step, reason}`, invocations 0,
`workdir/<outputs>/fleet-job.json`) and every later step refuses too: a refused job never runs, and
its refusal is an operational fault, not a result. A step already done prints the state and
changes nothing; a step whose predecessor is not done is a usage error (exit 2).

The state lives in `JOBDIR/state.json`, replaced atomically and fsynced; each step holds
`JOBDIR/.lock` while it changes it. This module holds the job file, the state and the order;
the steps live in jobfetch (toolchain), jobscan (modules), jobgates (gates), jobrun (run),
jobstop (stop). It imports neither huggingface_hub nor elftools: only the step that needs one
imports it.

The store token (`<root>/hf_token`) is for `fetch` alone: fetch removes it whatever its outcome,
so do a refusal and a stop, and `gate` and `run` remove it again before any of the job's code
starts (refusing when they cannot): the job's own code never runs while it is on the box.

`job stop` (jobstop) writes `JOBDIR/stop.json` before anything else; every step looks for it
under the lock and closes the job instead of going on (`phase: interrupted`, `stopped`).
"""

from __future__ import annotations

import fcntl
import math
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from agent.errors import AgentError, usage_error
from agent.files import read_json, write_json
from agent.journal import utc

STEPS = ("admit", "fetch", "scan", "gate", "run")
# the phase each step starts from, and the one it leaves behind when it succeeds
BEFORE = {"admit": "new", "fetch": "admitted", "scan": "fetched", "gate": "scanned",
          "run": "gated"}
AFTER = {"admit": "admitted", "fetch": "fetched", "scan": "scanned", "gate": "gated",
         "run": "running"}
RANK = {"new": 0, "admitted": 1, "fetched": 2, "scanned": 3, "gated": 4, "running": 5,
        "finished": 6, "failed": 6, "interrupted": 6}
ENDED = ("finished", "failed", "interrupted")
# the step a refusal names in the state
STEP_NAMES = {"admit": "gpu", "fetch": "toolchain", "scan": "scan", "gate": "gates"}
REFUSED = 3  # exit status of a refused job
TOKEN_FILES = ("hf_token", "hf_token.fleet-new")  # the store token, and a deploy's upload of it
LOCK_POLL_S = 0.1

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
REPO_TYPES = ("model", "dataset", "space")
TOP_KEYS = ("name", "command", "outputs", "ttl_minutes", "gates", "modules", "toolchain",
            "store_endpoint", "admission")
ADMISSION_KEYS = ("driver", "qualified_gpus", "banned_symbols", "allowed_symbols")
GATE_KEYS = ("name", "command", "min_passed")
TOOLCHAIN_KEYS = ("repo", "revision", "path", "repo_type")


@dataclass(frozen=True)
class Gate:
    name: str
    command: str
    min_passed: int


@dataclass(frozen=True)
class Toolchain:
    repo: str
    revision: str  # refused at fetch unless a 40-hex commit
    path: str  # where it appears under workdir/
    repo_type: str


@dataclass(frozen=True)
class JobAdmission:
    driver: str
    qualified_gpus: tuple[str, ...]
    banned_symbols: tuple[str, ...]
    allowed_symbols: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    dir: Path
    name: str
    command: str
    outputs: str
    ttl_minutes: float
    gates: tuple[Gate, ...]
    modules: tuple[str, ...]
    toolchain: Toolchain | None
    store_endpoint: str | None
    admission: JobAdmission

    @property
    def root(self) -> Path:
        """The agent's root: JOBDIR is <root>/jobs/<name>."""
        return self.dir.parent.parent

    @property
    def work(self) -> Path:
        return self.dir / "workdir"

    @property
    def outputs_dir(self) -> Path:
        return self.work / self.outputs

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    @property
    def log(self) -> Path:
        return self.dir / "job.log"

    @property
    def ttl_s(self) -> float:
        return self.ttl_minutes * 60.0


# ---------------------------------------------------------------------------- job.json


def load_job(jobdir: Path) -> Job:
    """JOBDIR/job.json, checked key by key: any problem is one usage error (exit 2)."""
    jobdir = Path(os.path.abspath(jobdir))
    path = jobdir / "job.json"
    if not jobdir.is_dir():
        raise usage_error(f"job directory {jobdir} not found")
    if jobdir.parent.name != "jobs":
        raise usage_error(f"{jobdir}: a job directory is <root>/jobs/<name>")
    try:
        import json

        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise usage_error(f"{path} not found") from None
    except OSError as e:
        raise usage_error(f"{path} unreadable: {e.strerror}") from None
    except ValueError as e:
        raise usage_error(f"{path} is not JSON: {e}") from None
    where = str(path)
    top = _keys(raw, TOP_KEYS, where)
    name = _string(top, "name", where)
    if not NAME.match(name) or name != jobdir.name:
        raise usage_error(f"{where}: name {name!r} must be the job directory's name "
                          f"({jobdir.name!r}) and match {NAME.pattern}")
    ttl = top["ttl_minutes"]
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl) \
            or ttl <= 0:
        raise usage_error(f"{where}: ttl_minutes must be a positive number, got {ttl!r}")
    gates = []
    for i, g in enumerate(_list(top, "gates", where)):
        gw = f"{where}: gates[{i}]"
        gt = _keys(g, GATE_KEYS, gw)
        low = gt["min_passed"]
        if isinstance(low, bool) or not isinstance(low, int) or low < 1:
            # a gate that ran no test proves nothing
            raise usage_error(f"{gw}.min_passed must be a whole number >= 1, got {low!r}")
        gates.append(Gate(_string(gt, "name", gw), _string(gt, "command", gw), low))
    if len({g.name for g in gates}) != len(gates):
        raise usage_error(f"{where}: gate names must be unique")
    modules = tuple(_relative(m, f"{where}: modules[{i}]")
                    for i, m in enumerate(_strings(top, "modules", where)))
    toolchain = None
    if top["toolchain"] is not None:
        tw = f"{where}: toolchain"
        tt = _keys(top["toolchain"], TOOLCHAIN_KEYS, tw)
        repo_type = _string(tt, "repo_type", tw)
        if repo_type not in REPO_TYPES:
            raise usage_error(f"{tw}.repo_type must be one of {', '.join(REPO_TYPES)}, "
                              f"got {repo_type!r}")
        toolchain = Toolchain(_string(tt, "repo", tw), _string(tt, "revision", tw),
                              _relative(_string(tt, "path", tw), f"{tw}.path"), repo_type)
    endpoint = top["store_endpoint"]
    if endpoint is not None and (not isinstance(endpoint, str)
                                 or not endpoint.startswith(("http://", "https://"))):
        raise usage_error(f"{where}: store_endpoint must be null or an http(s) URL, "
                          f"got {endpoint!r}")
    aw = f"{where}: admission"
    at = _keys(top["admission"], ADMISSION_KEYS, aw)
    admission = JobAdmission(_string(at, "driver", aw), tuple(_strings(at, "qualified_gpus", aw)),
                             tuple(_strings(at, "banned_symbols", aw)),
                             tuple(_strings(at, "allowed_symbols", aw)))
    return Job(jobdir, name, _string(top, "command", where),
               _relative(_string(top, "outputs", where), f"{where}: outputs"), float(ttl),
               tuple(gates), modules, toolchain, endpoint, admission)


def _keys(raw: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise usage_error(f"{where} must be an object")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise usage_error(f"{where}: unknown key {unknown[0]!r}")
    missing = [k for k in keys if k not in raw]
    if missing:
        raise usage_error(f"{where}: missing key {missing[0]!r}")
    return raw


def _string(t: dict[str, Any], key: str, where: str) -> str:
    value = t[key]
    if not isinstance(value, str) or not value.strip():
        raise usage_error(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


def _list(t: dict[str, Any], key: str, where: str) -> list[Any]:
    value = t[key]
    if not isinstance(value, list):
        raise usage_error(f"{where}: {key} must be a list, got {value!r}")
    return value


def _strings(t: dict[str, Any], key: str, where: str) -> list[str]:
    values = _list(t, key, where)
    for v in values:
        if not isinstance(v, str) or not v.strip():
            raise usage_error(f"{where}: {key} must hold non-empty strings, got {v!r}")
    return values


def _relative(path: str, where: str) -> str:
    """A path (or glob) that stays inside workdir/: relative, no '..'."""
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts or path.strip() != path:
        raise usage_error(f"{where}: {path!r} must be a relative path inside workdir/ (no '..')")
    return path


# ---------------------------------------------------------------------------- the state


def fresh_state(job: Job) -> dict[str, Any]:
    return {"name": job.name, "phase": "new", "refused": None, "admission": None,
            "toolchain": None, "scan": None, "gates": None, "invocations": 0, "exit_code": None,
            "started_at": None, "finished_at": None, "timed_out": False, "interrupted": None,
            "runner": None, "process": None, "gating": None, "stopped": None}


def load_state(job: Job) -> dict[str, Any]:
    raw = read_json(job.state_path)
    if raw is None:
        if job.state_path.exists():
            raise AgentError(f"{job.state_path} is unreadable or not JSON; not guessing what "
                             "happened (look at it, then remove it to start the job over)")
        return fresh_state(job)
    if not isinstance(raw, dict) or raw.get("phase") not in (*RANK, "refused"):
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
    """workdir/<outputs>/fleet-job.json: what happened, beside the outputs themselves."""
    outcome = {"job": job.name, "phase": state["phase"], "invocations": state["invocations"],
               "refused": state["refused"], "admission": state["admission"],
               "gates": state["gates"], "exit_code": state["exit_code"],
               "timed_out": state["timed_out"], "interrupted": state["interrupted"],
               "stopped": state["stopped"], "started_at": state["started_at"],
               "finished_at": state["finished_at"]}
    try:
        job.outputs_dir.mkdir(parents=True, exist_ok=True)
        write_json(job.outputs_dir / "fleet-job.json", outcome, durable=True)
    except OSError as e:
        print(f"warning: cannot write {job.outputs_dir / 'fleet-job.json'}: {e.strerror or e}",
              file=sys.stderr)


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
    path = job.dir / "stop.json"
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
    state.update(phase="interrupted", gating=None, stopped=stopped_marker(job, was),
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


def with_deadline(job: Job, state: dict[str, Any]) -> dict[str, Any]:
    """The state as printed: `deadline_at` (UTC ISO) when the run or a gate ends at the ttl,
    by this box's clock: the run's started_at + ttl while running, a gate's start + ttl while
    it runs (each gate may take a full ttl)."""
    from agent import procs

    started: Any = None
    gating = state.get("gating")
    if gating is not None and procs.from_record(gating) is None:
        gating = None  # its gate (and the step that ran it) died: the job is between steps
    if state["phase"] == "running":
        started = state.get("started_at")
    elif isinstance(gating, dict):
        started = gating.get("started_at")
    at = _epoch(started)
    return {**state, "gating": gating, "deadline_at": None if at is None else
            utc(at + job.ttl_s)}


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


class Refused(Exception):
    """A step's guard said no: recorded as the job's refusal."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def refuse(job: Job, state: dict[str, Any], step: str, reason: str) -> None:
    state.update(phase="refused", refused={"step": step, "reason": reason}, gating=None)
    save_state(job, state)
    write_outcome(job, state)
    drop_token(job, strict=False)  # no later step will fetch


# ---------------------------------------------------------------------------- the steps


def run_step(step: str, jobdir: Path, wait: bool = False,
             grace: float = 10.0) -> tuple[dict[str, Any], int]:
    """Do one step (or just read the state: `state`, or stop the job: `stop`); returns the
    state to print and the exit status. A refused job (now or before) is exit 3, with its
    reason on stderr (`state` and `stop` exit 0). Every state printed has `deadline_at`."""
    job = load_job(jobdir)
    state, code = _step(step, job, wait, grace)
    return with_deadline(job, state), code


def _step(step: str, job: Job, wait: bool, grace: float) -> tuple[dict[str, Any], int]:
    if step == "state":
        from agent.jobrun import settle

        return settle(job), 0
    if step == "stop":
        from agent.jobstop import stop

        return stop(job, grace), 0
    if step == "run":
        from agent.jobrun import run

        state, code = run(job, wait)
        return state, _refused_status(state, code)
    with locked(job):
        state = load_state(job)
        if state["phase"] == "refused":
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
            _STEPS[step](job, state)
        except Refused as r:
            refuse(job, state, STEP_NAMES.get(step, step), r.reason)
            return state, _refused_status(state, 0)
        if stop_requested(job):  # asked for while the step ran
            close(job, state)
            return state, 0
        state["phase"] = AFTER[step]
        save_state(job, state)
        return state, 0


def _refused_status(state: dict[str, Any], code: int) -> int:
    if state["phase"] != "refused":
        return code
    refused = state["refused"] or {}
    print(f"refused: {refused.get('step')}: {refused.get('reason')}", file=sys.stderr)
    return REFUSED


def _missing(phase: str) -> str:
    """What must happen next, for a job in this phase."""
    for step in STEPS:
        if BEFORE[step] == phase:
            return f"`job {step}`"
    return "nothing"


def admit_step(job: Job, state: dict[str, Any]) -> None:
    admission = check_admission(job)
    state["admission"] = admission
    if not admission["admitted"]:
        raise Refused(admission["reason"])


def check_admission(job: Job) -> dict[str, Any]:
    """The exact driver and the qualified GPUs, through NVML (agent.gpu)."""
    from agent.gpu import admit, read_gpu

    a = job.admission
    return admit(read_gpu(), a.driver, list(a.qualified_gpus)).as_dict()


def _fetch_step(job: Job, state: dict[str, Any]) -> None:
    from agent.jobfetch import fetch

    try:
        state["toolchain"] = fetch(job)
    finally:
        drop_token(job)  # fetch consumes the token: nothing after it may read it


def _scan_step(job: Job, state: dict[str, Any]) -> None:
    from agent.jobscan import ScanRefused, scan_job

    try:
        state["scan"] = scan_job(job)
    except ScanRefused as e:
        state["scan"] = e.record
        raise Refused(e.reason) from None


def _gate_step(job: Job, state: dict[str, Any]) -> None:
    from agent.jobgates import run_gates

    drop_token(job)  # a gate is the job's own code
    state["gates"] = []
    failure = run_gates(job, state)
    if failure:
        raise Refused(failure)


_STEPS = {"admit": admit_step, "fetch": _fetch_step, "scan": _scan_step, "gate": _gate_step}


def now() -> float:
    return round(time.time(), 3)
