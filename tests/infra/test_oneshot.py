"""What every one-shot box must show after the one-shot deploy (testinfra, over SSH).

Every job on the box has its spec and a readable state; an ended job's record says what
happened (`outcome.json`, beside its state, never among its outputs), a refused one with zero
invocations; the store token is gone from the box once every job is past its fetch (the fetch
consumes it; the job never runs with it), and appears in no file the jobs wrote.
"""

from __future__ import annotations

import json
from typing import Any

from agent.contract import ROOT

PHASES = {"new", "admitted", "fetched", "scanned", "gated", "running", "finished", "failed",
          "interrupted", "refused"}


def jobs(host: Any) -> list[str]:
    out = host.run(f"ls -1 {ROOT}/jobs 2>/dev/null")
    return [line for line in out.stdout.split() if line]


def test_the_agent_is_installed(oneshot_host: Any) -> None:
    assert oneshot_host.file(f"{ROOT}/venv/bin/python").exists
    assert oneshot_host.file(f"{ROOT}/agent/BUNDLE").exists
    assert oneshot_host.run(f"cd {ROOT} && venv/bin/python -m agent gpu").rc == 0


def test_every_job_has_a_spec_and_a_readable_state(oneshot_host: Any) -> None:
    names = jobs(oneshot_host)
    assert names, "the deploy left no job on the box"
    for name in names:
        d = f"{ROOT}/jobs/{name}"
        spec = json.loads(oneshot_host.file(f"{d}/job.json").content_string)
        assert spec["name"] == name
        state = json.loads(oneshot_host.check_output(
            f"cd {ROOT} && venv/bin/python -m agent job state {d}"))
        assert state["phase"] in PHASES, state


def test_an_ended_job_says_what_happened_in_its_record(oneshot_host: Any) -> None:
    for name in jobs(oneshot_host):
        d = f"{ROOT}/jobs/{name}"
        state = json.loads(oneshot_host.file(f"{d}/state.json").content_string)
        if state["phase"] not in ("finished", "failed", "interrupted", "refused"):
            continue
        record = json.loads(oneshot_host.file(f"{d}/outcome.json").content_string)
        if state["phase"] == "refused":
            # a refusal is a fault of the box: nothing ran, no result
            assert state["invocations"] == 0 and record["invocations"] == 0, record
            assert record["refused"]["reason"], record
        else:
            assert state["invocations"] == 1 and record["invocations"] == 1, record
            assert record["exit_code"] == state["exit_code"], record


def test_no_store_token_is_left_on_the_box_after_the_fetch(oneshot_host: Any) -> None:
    phases = [json.loads(oneshot_host.file(f"{ROOT}/jobs/{name}/state.json").content_string
                         )["phase"] for name in jobs(oneshot_host)]
    token = oneshot_host.file(f"{ROOT}/hf_token")
    if any(phase in ("new", "admitted") for phase in phases):
        # a job's fetch is still to come: the token may wait for it, private
        assert not token.exists or (token.mode == 0o600 and token.user == "root")
        return
    assert phases and not token.exists, "the store token is still on the box after the fetch"
    assert not oneshot_host.file(f"{ROOT}/hf_token.fleet-new").exists
