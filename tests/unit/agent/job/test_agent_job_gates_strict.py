"""A gate proves that a test ran: every pytest summary in its output is read (any failure in any
of them refuses), and its command runs under `set -e` for `;` as well as for pipes."""

from __future__ import annotations

import pytest
from agentbox import Box
from jobtools import job, state_of, step_ok, write_job


def gated(box: Box, command: str) -> tuple[int, dict]:
    jobdir = write_job(box, gates=[{"name": "g", "command": command, "min_passed": 1}])
    for step in ("admit", "fetch", "scan"):
        step_ok(box, step, jobdir)
    done = job(box, "gate", jobdir)
    return done.returncode, state_of(done)


def test_a_failing_summary_before_a_passing_one_refuses(box: Box) -> None:
    code, state = gated(box, "echo '2 failed, 10 passed in 0.5s'; echo '5 passed in 0.1s'")
    assert code == 3 and state["phase"] == "refused", state
    assert "2 failed" in state["refused"]["reason"]
    assert state["gates"][0]["failed"] == 2 and state["gates"][0]["passed"] == 15


def test_an_error_in_an_earlier_verbose_summary_refuses(box: Box) -> None:
    code, state = gated(box, "echo '=== 1 error in 0.5s ==='; echo '=== 5 passed in 0.1s ==='")
    assert code == 3 and "1 error" in state["refused"]["reason"]


def test_a_failing_command_before_a_semicolon_refuses(box: Box) -> None:
    code, state = gated(box, "false; echo '5 passed in 0.1s'")
    assert code == 3 and "exited 1" in state["refused"]["reason"], state


# each hides the failure of `false` (standing for a pytest run that failed) before a summary
# that passes, or reads `false` in a way the agent cannot see
HIDDEN = ["set +e", "set +o errexit", "set +o pipefail", "set +eu", "s\\et +e", "'set' +e",
          "set +uo errexit", "shopt -uo errexit", "s=set; $s +e", "false || true",
          "if false; then :; fi", "sh -c 'false; true'", "env bash -c false",
          "timeout 60 /bin/sh -c false", "env -S 'sh -c false'", "eval false || true",
          "false & wait", "(false) || true", "{ false; } || true", "true $(false)",
          "trap '' ERR", "command false || true", "false | tee log || true"]


@pytest.mark.parametrize("off", HIDDEN)
def test_a_gate_that_could_hide_a_failure_is_refused_when_the_job_is_read(box: Box,
                                                                          off: str) -> None:
    jobdir = write_job(box, gates=[{"name": "g", "command": f"{off}; false; "
                                    "echo '5 passed in 0.1s'", "min_passed": 1}])
    done = job(box, "admit", jobdir)
    assert done.returncode == 2, (off, done.returncode, done.stdout)
    assert "cannot be read strictly" in done.stderr and "set -e" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (jobdir / "state.json").exists()


def test_a_failure_before_and_and_stops_the_gate(box: Box) -> None:
    # under `set -e` bash goes on after `false && x`: the agent runs `&&` as it runs `;`
    code, state = gated(box, "false && true; echo '5 passed in 0.1s'")
    assert code == 3 and "exited 1" in state["refused"]["reason"], state


def test_quoted_separators_and_keywords_are_words(box: Box) -> None:
    code, state = gated(box, "echo 'a; false || true' \"if\" && echo '5 passed in 0.1s'")
    assert code == 0 and state["phase"] == "gated", state
    log = box.root / "jobs" / "bench" / state["gates"][0]["log"]
    assert log.read_text() == "a; false || true if\n5 passed in 0.1s\n"


def test_a_gate_writes_and_reads_files_it_names(box: Box) -> None:
    code, state = gated(box, "echo '5 passed in 0.1s' > summary.txt 2>&1\ncat < summary.txt")
    assert code == 0 and state["gates"][0]["passed"] == 5, state
