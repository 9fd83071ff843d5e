"""Facts about a one-shot job on a box, read in one SSH command each."""

from __future__ import annotations

from typing import TypedDict, cast

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from agent import contract
from facts.box import _at, _json, _probe


class Unreadable(TypedDict):
    """What stands for a state.json that is not JSON: every step treats it as not done."""

    phase: str  # "unreadable"


class JobOnBox(TypedDict):
    """The `JobState` fact (`facts/probes/job.py`): the digests, and the job's state.json."""

    spec_sha256: str | None
    inputs_sha256: str | None
    token_sha256: str | None
    state: contract.JobStateFile | Unreadable | None


class JobState(FactBase[JobOnBox]):
    """
    A one-shot job on the box: the digest of its ``job.json`` and of its shipped inputs, the
    digest of the store token file (never the token; null once the job's fetch consumed it,
    and from then on the deploy never writes it again), and the agent's ``state.json`` for the
    job (``None`` before its first step; ``{"phase": "unreadable"}`` when it cannot be read,
    which every step treats as not done).
    """

    @staticmethod
    def default() -> JobOnBox:
        return {"spec_sha256": None, "inputs_sha256": None, "token_sha256": None,
                "state": None}

    def command(self, root: str, job: str) -> StringCommand:
        jobdir = _at(root, f"{contract.JOBS}/{job}")
        return _probe("job", "--spec", f"{jobdir}/{contract.JOB_FILE}",
                      "--inputs-sha256", f"{jobdir}/{contract.JOB_INPUTS_DIGEST}",
                      "--state", f"{jobdir}/{contract.JOB_STATE}",
                      "--token", _at(root, contract.TOKEN))

    def process(self, output: list[str]) -> JobOnBox:
        data = _json(output, "JobState")
        if not isinstance(data, dict):
            raise FactProcessError("JobState: expected an object")
        return cast(JobOnBox, data)
