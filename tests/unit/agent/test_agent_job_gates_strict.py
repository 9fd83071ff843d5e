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


@pytest.mark.parametrize("off", ["set +e", "set +o errexit", "set +o pipefail", "set +eu"])
def test_a_gate_that_turns_errexit_off_is_refused(box: Box, off: str) -> None:
    jobdir = write_job(box, gates=[{"name": "g", "command": f"{off}; false; "
                                    "echo '5 passed in 0.1s'", "min_passed": 1}])
    done = job(box, "admit", jobdir)
    assert done.returncode == 2 and "set -e" in done.stderr, done.stderr
