"""The one-shot deploy's store token: on the box only until the job's fetch consumes it, so a
second run of the deploy changes nothing and never puts it back where the job could read it."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from operations.job import token_wanted

TOKEN = "hf_test_token_value"
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()


def info(phase: str | None, present: str | None = None, **state: Any) -> dict[str, Any]:
    return {"token_sha256": present,
            "state": None if phase is None else {"phase": phase, "refused": None, **state}}


@pytest.mark.parametrize(("facts", "wanted"), [
    (info(None), True),  # a new job: its fetch needs the token
    (info("admitted"), True),
    (info("new", DIGEST), None),  # current
    (info("new", "0" * 64), True),  # another token: replaced
    # the fetch consumed it: a second deploy run writes nothing ...
    (info("fetched"), None), (info("finished"), None), (info("running"), None),
    (info("refused", refused={"step": "gpu", "reason": "x"}), None),
    (info("interrupted"), None), (info("unreadable"), None),
    # ... and removes one left behind
    (info("gated", DIGEST), False), (info("finished", "0" * 64), False),
])
def test_the_token_is_there_only_before_the_fetch(facts: dict[str, Any],
                                                  wanted: bool | None) -> None:
    assert token_wanted(facts, TOKEN) is wanted
