"""The one-shot guards on the box, with the real agent CLI against temp boxes: a gate
proves something only when tests ran and none failed; the modules that run are the ones that
were scanned; the job never sees the store token; `job stop` ends a job with its end recorded,
and `job state` tells the box's own deadline."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agentbox import PY, Box, wait_for
from jobtools import JOB_PY, job, outcome, pytest_gate, runs, state_of, step_ok, workdir, write_job

from agent.job.gates import parse_summary


def through(box: Box, jobdir: Path, *steps: str) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for step in steps:
        state = step_ok(box, step, jobdir)
    return state


def refused(done: subprocess.CompletedProcess[str], step: str, reason: str) -> dict[str, Any]:
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert done.stderr.strip().startswith(f"refused: {step}: ") and reason in done.stderr, \
        done.stderr
    state = state_of(done)
    assert state["phase"] == "refused" and state["invocations"] == 0, state
    return state


def gate(name: str, shell: str, min_passed: int = 1) -> dict[str, Any]:
    return {"name": name, "command": shell, "min_passed": min_passed}


# ---------------------------------------------------------------- case 14: gates


def test_a_gate_must_want_at_least_one_passed_test(box: Box) -> None:
    jobdir = write_job(box, gates=[gate("parity", "echo '3 passed in 0.1s'", 0)])
    done = job(box, "admit", jobdir)
    assert done.returncode == 2 and "min_passed must be a whole number >= 1" in done.stderr
    assert not (jobdir / "state.json").exists()


@pytest.mark.parametrize(("output", "why"), [
    # an all-skipped run ran no test
    ("12 skipped in 0.51s", "0 passed (at least 1 wanted)"),
    ("no tests ran in 0.01s", "0 passed (at least 1 wanted)"),
    # failures count, whatever else passed (`pytest | tee` exits 0 without pipefail)
    ("=== 3 failed, 4 passed in 0.50s ===", "3 failed"),
    ("4 passed, 1 error in 0.50s", "1 error"),
    # not a summary line: no count at all
    ("0/12 passed", "does not end with pytest's summary line"),
    ("12 passed in 0.5s\\ndone", "does not end with pytest's summary line"),
    ("", "does not end with pytest's summary line"),
])
def test_a_gate_passes_only_on_a_strict_summary_with_passes_and_no_failure(
        box: Box, output: str, why: str) -> None:
    jobdir = write_job(box, gates=[gate("parity", f"printf '{output}\\n'", 4 if "4" in output
                                        else 1)])
    through(box, jobdir, "admit", "fetch", "scan")
    state = refused(job(box, "gate", jobdir), "gates", why)
    assert state["gates"][0]["ok"] is False and state["gates"][0]["exit_code"] == 0
    assert runs(jobdir) == 0
    assert refused(job(box, "run", jobdir, "--wait"), "gates", why)["invocations"] == 0
    assert runs(jobdir) == 0


def test_a_gate_runs_with_pipefail(box: Box) -> None:
    # the pytest run failed (exit 1) but its summary, piped through cat, reads as a pass
    jobdir = write_job(box, gates=[gate("parity", f"{JOB_PY} -c \"print('5 passed in 0.1s'); "
                                        "raise SystemExit(1)\" | cat")])
    through(box, jobdir, "admit", "fetch", "scan")
    state = refused(job(box, "gate", jobdir), "gates", "gate 'parity' failed: exited 1")
    assert state["gates"][0]["passed"] == 5 and state["gates"][0]["exit_code"] == 1


def test_a_passing_gate_records_its_summary(box: Box) -> None:
    jobdir = write_job(box, gates=[
        gate("parity", "echo '===== 4 passed, 2 skipped, 1 warning in 0.50s (0:00:00) ====='",
             4)])
    state = through(box, jobdir, "admit", "fetch", "scan", "gate")
    (g,) = state["gates"]
    assert g["ok"] is True and g["passed"] == 4 and g["failed"] == 0 and g["errors"] == 0
    assert g["summary"].startswith("===== 4 passed")


@pytest.mark.parametrize(("line", "counts"), [
    ("3 passed in 0.01s", {"passed": 3}),
    ("==== 1 failed, 2 passed, 3 deselected in 1.20s ====", {"failed": 1, "passed": 2,
                                                            "deselected": 3}),
    ("2 errors in 0.1s", {"errors": 2}),
    ("1 passed, 1 xfailed, 1 xpassed, 2 warnings, 1 rerun in 72.50s (0:01:12)",
     {"passed": 1, "xfailed": 1, "xpassed": 1, "warnings": 2, "reruns": 1}),
    ("no tests ran in 0.00s", {}),
    ("0/12 passed", None),
    ("12 passed", None),  # no duration: not pytest's line
    ("ok: 12 passed in 0.1s", None),
    ("3 passed, 3 passed in 0.1s", None),
    ("3 bananas in 0.1s", None),
])
def test_the_summary_line_is_read_strictly(line: str, counts: dict[str, int] | None) -> None:
    got = parse_summary(line)
    assert (None if got is None else got["counts"]) == counts


# ---------------------------------------------------------------- case 15: scan


def test_a_job_that_names_no_modules_where_the_role_bans_symbols_is_refused(box: Box) -> None:
    jobdir = write_job(box, modules=[])
    through(box, jobdir, "admit", "fetch")
    refused(job(box, "scan", jobdir), "scan", "the job names no modules to scan")
    assert refused(job(box, "run", jobdir), "scan", "names no modules")["invocations"] == 0
    assert runs(jobdir) == 0
    # where the role bans nothing, no modules is fine
    other = write_job(box, "free", modules=[], admission={"banned_symbols": []})
    assert through(box, other, "admit", "fetch", "scan")["phase"] == "scanned"


@pytest.mark.parametrize(("change", "why"), [
    ("echo '.visible .entry cublasSgemm_k() { ret; }' >> kernels/clean.ptx",
     "module kernels/clean.ptx changed after the scan"),
    ("echo x > kernels/new.ptx", "module kernels/new.ptx appeared after the scan"),
    ("rm kernels/clean.ptx", "module kernels/clean.ptx is gone or unreadable since the scan"),
])
def test_a_module_changed_after_the_scan_refuses_the_run(box: Box, change: str,
                                                         why: str) -> None:
    jobdir = write_job(box, gates=[pytest_gate("rewrite", 1, change)])
    state = through(box, jobdir, "admit", "fetch", "scan")
    assert set(state["scan"]["digests"]) == {"kernels/clean.ptx"}
    through(box, jobdir, "gate")
    state = refused(job(box, "run", jobdir, "--wait"), "scan", why)
    assert state["started_at"] is None and runs(jobdir) == 0
    assert outcome(jobdir)["invocations"] == 0


# ---------------------------------------------------------------- case 16: the store token

PRESENCE = "(test -e {root}/hf_token && echo present || echo absent) >> {where}"
# the strict gate form (no `test`, a builtin a gate may not name): fails the gate when present
GATE_PRESENCE = (JOB_PY + " -c \"import os, sys; sys.exit(os.path.exists('{root}/hf_token'))\"; "
                 "echo absent >> {where}")


def test_the_job_and_its_gates_run_without_the_store_token(box: Box) -> None:
    token = box.root / "hf_token"
    token.write_text("hf_secret_not_for_the_job\n")
    token.chmod(0o600)
    (box.root / "hf_token.fleet-new").write_text("hf_secret_not_for_the_job\n")
    probe = GATE_PRESENCE.format(root=box.root, where="gate-saw")
    jobdir = write_job(box, gates=[pytest_gate("probe", 1, probe)],
                       command=PRESENCE.format(root=box.root, where="out/saw"))
    through(box, jobdir, "admit")
    assert token.exists()
    through(box, jobdir, "fetch")  # fetch consumes it, toolchain or not
    assert not token.exists() and not (box.root / "hf_token.fleet-new").exists()
    token.write_text("hf_secret_again\n")  # a deploy that wrote it once more
    through(box, jobdir, "scan", "gate")
    assert not token.exists()
    token.write_text("hf_secret_again\n")
    done = job(box, "run", jobdir, "--wait")
    assert done.returncode == 0, done.stderr
    assert (workdir(jobdir) / "gate-saw").read_text() == "absent\n"
    assert (workdir(jobdir) / "out" / "saw").read_text() == "absent\n"
    assert not token.exists()


@pytest.mark.parametrize("step", ["gate", "run"])
def test_a_token_that_cannot_be_removed_refuses_before_the_jobs_code(box: Box,
                                                                     step: str) -> None:
    jobdir = write_job(box, gates=[pytest_gate("g", 1, "echo ran >> gate-ran")])
    through(box, jobdir, "admit", "fetch", "scan", *(["gate"] if step == "run" else []))
    (box.root / "hf_token" / "stuck").mkdir(parents=True)  # unlink fails: not a plain file
    state = refused(job(box, step, jobdir), "gates" if step == "gate" else "token",
                    "cannot be removed")
    assert state["invocations"] == 0 and runs(jobdir) == 0
    assert (workdir(jobdir) / "gate-ran").exists() == (step == "run")


def test_a_refusal_drops_the_token(box: Box) -> None:
    (box.root / "hf_token").write_text("hf_secret\n")
    jobdir = write_job(box, admission={"driver": "1.2.3"})
    refused(job(box, "admit", jobdir), "gpu", "not the admitted 1.2.3")
    assert not (box.root / "hf_token").exists()


# ---------------------------------------------------------------- case 1: stop and deadline


def start(box: Box, command: str, ttl_minutes: float = 30) -> Path:
    jobdir = write_job(box, command=command, ttl_minutes=ttl_minutes)
    through(box, jobdir, "admit", "fetch", "scan", "gate")
    step_ok(box, "run", jobdir)
    wait_for(lambda: (workdir(jobdir) / "started").exists(), "the command started")
    return jobdir


def test_state_tells_the_boxs_own_deadline_while_the_job_runs(box: Box) -> None:
    assert step_ok(box, "state", write_job(box, "idle"))["deadline_at"] is None
    jobdir = start(box, "touch started && sleep 600", ttl_minutes=90)
    state = step_ok(box, "state", jobdir)
    assert state["phase"] == "running"
    deadline = datetime.fromisoformat(state["deadline_at"].replace("Z", "+00:00"))
    assert deadline == datetime.fromtimestamp(int(state["started_at"] + 90 * 60), UTC)
    assert json.loads((jobdir / "state.json").read_text()).get("deadline_at") is None  # derived
    stop = job(box, "stop", jobdir, "--grace", "1")
    assert stop.returncode == 0, stop.stderr


def test_stop_terms_a_running_job_and_returns_once_its_end_is_recorded(box: Box) -> None:
    jobdir = start(box, "touch started && echo part > out/part.txt && sleep 600")
    began = time.monotonic()
    done = job(box, "stop", jobdir, "--grace", "5")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - began < 5  # sleep dies of the TERM: no wait for the grace
    state = state_of(done)
    assert state["phase"] == "failed" and state["exit_code"] == -15 and state["invocations"] == 1
    assert state["stopped"]["by"] == "operator" and state["stopped"]["phase"] == "running"
    assert state["stopped"]["grace_s"] == 5 and state["deadline_at"] is None
    written = outcome(jobdir)
    assert written["stopped"] == state["stopped"] and written["exit_code"] == -15
    assert (workdir(jobdir) / "out" / "part.txt").read_text() == "part\n"
    # again: nothing changes
    again = job(box, "stop", jobdir)
    assert again.returncode == 0 and state_of(again) == state
    assert step_ok(box, "run", jobdir) == state  # ended: never run again


def test_stop_kills_a_command_that_ignores_term_after_the_grace(box: Box) -> None:
    jobdir = start(box, "trap '' TERM; touch started; sleep 600")
    began = time.monotonic()
    done = job(box, "stop", jobdir, "--grace", "1")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - began >= 1
    state = state_of(done)
    assert state["phase"] == "failed" and state["exit_code"] == -9 and state["stopped"]


@pytest.mark.parametrize("steps", [(), ("admit",), ("admit", "fetch", "scan", "gate")])
def test_stop_closes_a_job_that_never_ran_and_no_step_starts_after_it(
        box: Box, steps: tuple[str, ...]) -> None:
    jobdir = write_job(box)
    through(box, jobdir, *steps)
    was = step_ok(box, "state", jobdir)["phase"]
    state = state_of(job(box, "stop", jobdir))
    assert state["phase"] == "interrupted" and state["invocations"] == 0
    assert state["stopped"]["phase"] == was and "before it ran" in state["interrupted"]["reason"]
    assert outcome(jobdir)["phase"] == "interrupted"  # the outputs folder exists now
    for step in ("admit", "fetch", "scan", "gate", "run"):
        assert job(box, step, jobdir).returncode == 0
    assert job(box, "run", jobdir, "--wait").returncode == 1
    assert runs(jobdir) == 0 and step_ok(box, "state", jobdir)["phase"] == "interrupted"


def test_stop_ends_a_gate_that_runs_and_the_job_never_runs(box: Box) -> None:
    jobdir = write_job(box, gates=[pytest_gate("slow", 1, "touch gating", "sleep 600")])
    through(box, jobdir, "admit", "fetch", "scan")
    gating = subprocess.Popen([PY, "-m", "agent", "job", "gate", str(jobdir)], env=box.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (workdir(jobdir) / "gating").exists(), "the gate started")
        wait_for(lambda: step_ok(box, "state", jobdir)["deadline_at"], "the gate's deadline")
        done = job(box, "stop", jobdir, "--grace", "1")
        assert done.returncode == 0, done.stderr
        state = state_of(done)
        assert state["phase"] == "interrupted" and state["stopped"]["phase"] == "scanned"
        assert state["invocations"] == 0 and state["gating"] is None
        assert gating.wait(timeout=30) == 0
    finally:
        gating.kill()
        gating.wait()
    assert job(box, "run", jobdir).returncode == 0 and runs(jobdir) == 0


def test_stop_of_an_ended_or_refused_job_changes_nothing(box: Box) -> None:
    jobdir = write_job(box, admission={"driver": "1.2.3"})
    state = refused(job(box, "admit", jobdir), "gpu", "1.2.3")
    done = job(box, "stop", jobdir)
    assert done.returncode == 0 and state_of(done) == state
    assert not (jobdir / "stop.json").exists()


# ---------------------------------------------------------------- the outputs folder's place

@pytest.mark.parametrize("taken", ["out", "out-link"])
def test_outputs_that_cannot_be_a_folder_refuse_the_job_before_any_of_its_code_runs(
        box: Box, taken: str) -> None:
    jobdir = write_job(box, command="echo ran >> runs.txt")
    work = workdir(jobdir)
    if taken == "out":
        (work / "out").write_text("a file where the outputs folder goes\n")
    else:
        (work / "elsewhere").mkdir()
        (work / "out").symlink_to(work / "elsewhere")
    through(box, jobdir, "admit", "fetch", "scan")
    # the work directory is handed to the job's user at the gate step's start: refused there,
    # with the reason, before any gate or the command runs
    state = refused(job(box, "gate", jobdir), "gates",
                    "workdir/out exists in the job's inputs and is not a folder")
    assert state["started_at"] is None and runs(jobdir) == 0
    assert job(box, "run", jobdir, "--wait").returncode == 3 and runs(jobdir) == 0
    assert outcome(jobdir)["invocations"] == 0
