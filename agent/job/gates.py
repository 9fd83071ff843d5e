"""`job gate`: the job's gates, each a shell command run in workdir/ before the measurement.

A gate proves something only when it ran tests and none failed. It passes when all of these
hold, and fails closed otherwise:
- it exits 0 within the job's ttl, run as agent.job.gate_command read it: every pipeline on a
  line of its own under `bash -e -o pipefail -c` (a `pytest | tee log` that failed exits
  non-zero, and so do `pytest a; pytest b` and `pytest a && pytest b` where `a` failed);
- the last non-empty line of its output is pytest's final summary line, read strictly:
  `[=== ]<count> <outcome>[, <count> <outcome>...] in <secs>s[ (h:mm:ss)][ ===]` with outcomes
  among passed, failed, error(s), skipped, deselected, xfailed, xpassed, warning(s), rerun(s),
  or `no tests ran in <secs>s` (a count like `0/12 passed` is no summary);
- no summary line anywhere in its output reports `failed` or `error` (every pytest run of a
  gate counts, not only the last);
- its summaries report at least `min_passed` (at least 1) passed tests in all: an all-skipped
  run fails.
Gates run in order; the first that fails refuses the job and the rest do not run. Each gate's
output goes to `JOBDIR/gates/<n>-<name>.log`. The gate step is the kill domain of its gates
(agent.job.domain): when a gate ends, whatever it started is killed, and its record says how
many (`killed`). While a gate runs, `state.gating` names it (its
process identity and start) so that `job state` can tell its deadline and `job stop` end it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from typing import Any

from agent.base import procs
from agent.job import domain, jobuser
from agent.job.gate_command import read_gate
from agent.job.model import Gate, Job, now
from agent.job.state import save_state, stop_requested

# the script read from the gate's command (agent.job.gate_command), each pipeline stopping it
# when it fails (Debian's /bin/sh, dash, has no pipefail); a command that does not read
# strictly is refused when the job file is read (agent.job.model)
SHELL = ("/bin/bash", "-e", "-o", "pipefail", "-c")
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
OUTCOMES = {"passed": "passed", "failed": "failed", "error": "errors", "errors": "errors",
            "skipped": "skipped", "deselected": "deselected", "xfailed": "xfailed",
            "xpassed": "xpassed", "warning": "warnings", "warnings": "warnings",
            "rerun": "reruns", "reruns": "reruns"}
SUMMARY = re.compile(r"(?:=+ )?(?P<body>.+?) in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?(?: =+)?")
ITEM = re.compile(r"(\d+) ([a-z]+)")
LOOSE = re.compile(r"(\d+) (failed|errors?)\b")


def run_gates(job: Job, state: dict[str, Any], dom: domain.Domain) -> str | None:
    """Run the gates, appending one record each to `state["gates"]`; the first failure's
    reason, or None when every gate passed (or a stop was asked for: the caller looks)."""
    folder = job.dir / "gates"
    folder.mkdir(exist_ok=True)
    job.work.mkdir(exist_ok=True)
    records: list[dict[str, Any]] = state["gates"]
    for i, gate in enumerate(job.gates, start=1):
        if stop_requested(job):
            return None
        log = folder / f"{i:02d}-{UNSAFE.sub('_', gate.name)[:60]}.log"
        record = run_gate(job, gate, log, state, dom)
        records.append(record)
        if not record["ok"]:
            return None if stop_requested(job) else _why(record)
    return None


def run_gate(job: Job, gate: Gate, log: Any, state: dict[str, Any],
             dom: domain.Domain) -> dict[str, Any]:
    started = time.monotonic()
    timed_out = False
    with open(log, "wb") as out:
        try:
            child = subprocess.Popen([*SHELL, read_gate(gate.command).text()], cwd=job.work,
                                     **jobuser.popen_kwargs(job, domain.environment(state["mark"]),
                                                            dom.preexec()),
                                     stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        except (OSError, subprocess.SubprocessError) as e:
            return {**_record(gate, None, started, False, None, log, job,
                              f"cannot start {SHELL[0]} in the step's domain: {e}"),
                    "killed": 0}
    ticks = procs.start_ticks_of(child.pid)
    state["gating"] = {"gate": gate.name, "started_at": now(), "pid": child.pid,
                       "start_ticks": ticks if ticks is not None else -1,
                       "boot_id": procs.boot_id(), "pgid": child.pid}
    save_state(job, state)  # `job state` tells this gate's deadline; `job stop` can end it
    if stop_requested(job):  # asked for before `job stop` could see this gate: end it here
        procs.signal_program(child.pid, child.pid, signal.SIGKILL)
    try:
        try:
            code = child.wait(timeout=job.ttl_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            procs.signal_program(child.pid, child.pid, signal.SIGKILL)
            code = child.wait()
    finally:
        state["gating"] = None
        try:
            killed, problem = dom.clear(), None  # what the gate left behind, in any session
        except domain.DomainError as e:
            killed, problem = 0, f"what it started could not be ended: {e}"
    return {**_record(gate, code, started, timed_out, summary_of(log), log, job, problem),
            "killed": killed}


def _record(gate: Gate, code: int | None, started: float, timed_out: bool,
            summary: dict[str, Any] | None, log: Any, job: Job,
            problem: str | None) -> dict[str, Any]:
    counts = (summary or {}).get("counts", {})
    passed = counts.get("passed", 0) if summary else None
    if problem is None:
        problem = _problem(gate, code, timed_out, summary, counts)
    return {"name": gate.name, "command": gate.command, "exit_code": code,
            "seconds": round(time.monotonic() - started, 3), "passed": passed,
            "failed": counts.get("failed", 0) if summary else None,
            "errors": counts.get("errors", 0) if summary else None,
            "summary": (summary or {}).get("line"), "min_passed": gate.min_passed,
            "timed_out": timed_out, "ok": problem is None, "problem": problem,
            "log": os.path.relpath(log, job.dir)}


def _problem(gate: Gate, code: int | None, timed_out: bool, summary: dict[str, Any] | None,
             counts: dict[str, int]) -> str | None:
    """Why the gate does not pass (every cause, in one line), or None when it does."""
    why = []
    if timed_out:
        why.append("did not finish within the job's ttl")
    elif code != 0:
        why.append(f"exited {code}")
    if summary is None:
        why.append("its output does not end with pytest's summary line (no test count)")
    else:
        why += [f"{counts[k]} {name}" for k, name in (("failed", "failed"), ("errors", "error"))
                if counts.get(k)]
        if counts.get("passed", 0) < gate.min_passed:
            why.append(f"{counts.get('passed', 0)} passed (at least {gate.min_passed} wanted)")
    return ", ".join(why) or None


def summary_of(log: Any) -> dict[str, Any] | None:
    """Every pytest summary line in the gate's output, read strictly: {line, counts} where
    `line` is the last non-empty line, which must be one, and `counts` are summed over all of
    them (a run of several pytest invocations counts each one's failures); None when the last
    non-empty line is not a summary. A line that reads like a summary with a failure or an
    error but not strictly counts them too: a failure is never lost to its wording."""
    counts: dict[str, int] = {}
    last = ""
    try:
        with open(log, "rb") as f:
            for raw in f:
                line = ANSI.sub("", raw.decode("utf-8", "replace")).strip()
                if not line:
                    continue
                last = line
                found = parse_summary(line)
                if found is None and SUMMARY.fullmatch(line):
                    found = {"counts": {OUTCOMES[k]: int(n) for n, k in LOOSE.findall(line)}}
                for key, n in (found or {}).get("counts", {}).items():
                    counts[key] = counts.get(key, 0) + n
    except OSError:
        return None
    return {"line": last, "counts": counts} if parse_summary(last) else None


def parse_summary(line: str) -> dict[str, Any] | None:
    """{line, counts} of one pytest summary line, read strictly; None when it is not one."""
    m = SUMMARY.fullmatch(line)
    if m is None:
        return None
    body = m.group("body")
    counts: dict[str, int] = {}
    if body != "no tests ran":
        for part in body.split(", "):
            item = ITEM.fullmatch(part)
            if item is None or item.group(2) not in OUTCOMES:
                return None
            key = OUTCOMES[item.group(2)]
            if key in counts:
                return None
            counts[key] = int(item.group(1))
    return {"line": line, "counts": counts}


def _why(r: dict[str, Any]) -> str:
    summary = f"summary {r['summary']!r}" if r["summary"] else "no summary line"
    return (f"gate {r['name']!r} failed: {r['problem']}; {summary}, {r['seconds']:.1f} s; "
            f"see {r['log']}")
