"""Facts about a one-shot job on a box, read in one SSH command each."""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.command import QuoteString
from pyinfra.api.exceptions import FactProcessError

from facts.box import _json

# stdlib only, under the box's python3, so it reads a box before the agent is installed;
# what is missing reads as null. argv: root, job name.
_PROBE = r"""
import hashlib, json, os, sys
root, name = sys.argv[1], sys.argv[2]
job = os.path.join(root, "jobs", name)
def read(p):
    try:
        with open(p, "rb") as f:
            return f.read()
    except OSError:
        return None
def sha(p):
    data = read(p)
    return None if data is None else hashlib.sha256(data).hexdigest()
state = read(os.path.join(job, "state.json"))
try:
    state = json.loads(state) if state else None
except ValueError:
    state = {"phase": "unreadable"}
inputs = read(os.path.join(job, "inputs.sha256"))
print(json.dumps({
    "spec_sha256": sha(os.path.join(job, "job.json")),
    "inputs_sha256": None if inputs is None else inputs.decode().strip(),
    "token_sha256": sha(os.path.join(root, "hf_token")),
    "state": state,
}))
"""


class JobState(FactBase[dict[str, Any]]):
    """
    A one-shot job on the box: the digest of its ``job.json`` and of its shipped inputs, the
    digest of the store token file (never the token; null once the job's fetch consumed it,
    and from then on the deploy never writes it again), and the agent's ``state.json`` for the
    job (``None`` before its first step; ``{"phase": "unreadable"}`` when it cannot be read,
    which every step treats as not done).
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return {"spec_sha256": None, "inputs_sha256": None, "token_sha256": None,
                "state": None}

    def command(self, root: str, job: str) -> StringCommand:
        return StringCommand("python3 -c", QuoteString(_PROBE), QuoteString(root),
                             QuoteString(job))

    def process(self, output: list[str]) -> dict[str, Any]:
        data = _json(output, "JobState")
        if not isinstance(data, dict):
            raise FactProcessError("JobState: expected an object")
        return data
