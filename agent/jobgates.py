"""`job gate`: the job's gates, each a shell command run in workdir/ before the measurement.

A gate passes when it exits 0 within the job's ttl and, where `min_passed` is above 0, its
output reports at least that many passed tests (pytest's `N passed`; no count is no pass).
Gates run in order; the first that fails refuses the job and the rest do not run. Each gate's
output goes to `JOBDIR/gates/<n>-<name>.log`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from typing import Any

from agent import procs
from agent.job import Gate, Job

PASSED = re.compile(rb"\b(\d+) passed\b")
TAIL_BYTES = 64 * 1024  # the summary line is at the end of the output
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def run_gates(job: Job, records: list[dict[str, Any]]) -> str | None:
    """Run the gates, appending one record each to `records`; the first failure's reason, or
    None when every gate passed."""
    folder = job.dir / "gates"
    folder.mkdir(exist_ok=True)
    job.work.mkdir(exist_ok=True)
    for i, gate in enumerate(job.gates, start=1):
        log = folder / f"{i:02d}-{UNSAFE.sub('_', gate.name)[:60]}.log"
        record = run_gate(job, gate, log)
        records.append(record)
        if not record["ok"]:
            return _why(record)
    return None


def run_gate(job: Job, gate: Gate, log: Any) -> dict[str, Any]:
    started = time.monotonic()
    timed_out = False
    with open(log, "wb") as out:
        child = subprocess.Popen(["/bin/sh", "-c", gate.command], cwd=job.work,
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        try:
            code = child.wait(timeout=job.ttl_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            procs.signal_program(child.pid, child.pid, signal.SIGKILL)
            code = child.wait()
    finally:
        procs.kill_group_leftovers(child.pid)  # what the gate left behind in its group
    passed = _passed(log)
    ok = code == 0 and not timed_out and (
        gate.min_passed == 0 or (passed is not None and passed >= gate.min_passed))
    return {"name": gate.name, "command": gate.command, "exit_code": code,
            "seconds": round(time.monotonic() - started, 3), "passed": passed,
            "min_passed": gate.min_passed, "timed_out": timed_out, "ok": ok,
            "log": os.path.relpath(log, job.dir)}


def _passed(log: Any) -> int | None:
    """The last `N passed` in the gate's output (pytest's summary), or None."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
            found = PASSED.findall(f.read())
    except OSError:
        return None
    return int(found[-1]) if found else None


def _why(r: dict[str, Any]) -> str:
    if r["timed_out"]:
        what = f"did not finish within the job's ttl ({r['seconds']:.0f} s)"
    elif r["exit_code"] != 0:
        what = f"exited {r['exit_code']}"
    else:
        what = "exited 0"
    count = "no pass count" if r["passed"] is None else f"{r['passed']} passed"
    return (f"gate {r['name']!r} failed: {what}, {count} (at least {r['min_passed']} wanted), "
            f"{r['seconds']:.1f} s; see {r['log']}")
