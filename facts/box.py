"""Facts about a fleet box, read in one SSH command each.

Every fact here is one command and one `process`, in pyinfra's manner. `BoxState` is the
deploy's workhorse: one round trip tells every operation of the standing deploy what the box
already has, which is what keeps a no-change re-run to a single command per box.
"""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.command import QuoteString
from pyinfra.api.exceptions import FactProcessError

# Shared by the probes below, which run under the box's python3 (stdlib only) with the fleet
# root as argv[1]. They never fail: what is missing reads as null, so a fresh box reads as a
# fresh box, not as an error.
_HELPERS = r"""
import hashlib, json, os, sys
root = sys.argv[1]
def sha(p):
    try:
        with open(p, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
def text(p):
    try:
        with open(p) as f:
            return f.read().strip()
    except OSError:
        return None
"""

_PROBE = _HELPERS + r"""
def alive(run):
    # the agent's own pid file, checked against what that pid runs (never its lock: taking
    # the lock even for a moment could make an agent starting right then refuse to run)
    try:
        with open(os.path.join(run, "agent.pid")) as f:
            pid = int(f.read().split()[0])
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, ValueError, IndexError):
        return False
    return b"agent" in argv and b"run" in argv
rel = os.path.join(root, "releases")
status = text(os.path.join(root, "run", "status.json"))
try:
    status = json.loads(status) if status else None
except ValueError:
    status = None
print(json.dumps({
    "python3": sys.executable,
    "python_version": "%d.%d" % sys.version_info[:2],
    "bundle": text(os.path.join(root, "agent", "BUNDLE")),
    "venv": os.path.exists(os.path.join(root, "venv", "bin", "python")),
    "files": {p: sha(p) for p in sys.argv[2:]},
    "releases": sorted(os.listdir(rel)) if os.path.isdir(rel) else [],
    "pointer": text(os.path.join(root, "standing.node")),
    "pointer_sha256": text(os.path.join(root, "standing.node.sha256")),
    "agent_alive": alive(os.path.join(root, "run")),
    "status": status,
}))
"""


def _json(output: list[str], what: str) -> Any:
    try:
        return json.loads("\n".join(output))
    except json.JSONDecodeError as e:
        raise FactProcessError(f"{what}: not JSON: {e}") from e


class BoxState(FactBase[dict[str, Any]]):
    """
    What the standing deploy needs to know of a box, in one round trip: python3, the installed
    agent bundle, the sha256 of each managed file named in ``files`` (``None`` when absent),
    releases, the node pointer, whether the agent holds its lock, and its last status.
    ``python3`` is ``None`` on a box without Python.
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return {"python3": None}

    def command(self, root: str, files: tuple[str, ...] = ()) -> StringCommand:
        return StringCommand(
            "if command -v python3 >/dev/null 2>&1; then python3 -c",
            QuoteString(_PROBE), QuoteString(root), *(QuoteString(f) for f in files),
            "; else echo '{\"python3\": null}'; fi",
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        data = _json(output, "BoxState")
        if not isinstance(data, dict):
            raise FactProcessError("BoxState: expected an object")
        return data


class _AgentJson(FactBase[dict[str, Any]]):
    """Base of the facts that print the agent CLI's JSON (``{}`` when no agent is installed)."""

    abstract = True
    subcommand = ""
    reads_config = True

    @staticmethod
    def default() -> dict[str, Any]:
        return {}

    def command(self, root: str) -> StringCommand:
        return StringCommand(
            "cd", QuoteString(root), "2>/dev/null && test -x venv/bin/python &&",
            "venv/bin/python -m agent", self.subcommand,
            "--config agent.toml" if self.reads_config else "", "|| true",
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        if not output:
            return {}
        data = _json(output, type(self).__name__)
        if not isinstance(data, dict):
            raise FactProcessError(f"{type(self).__name__}: expected an object")
        return data


class AgentStatus(_AgentJson):
    """The agent's status (``python -m agent status``): programs, node, admission, heartbeat."""

    subcommand = "status"


class GpuIdentity(_AgentJson):
    """The box's driver and GPUs as NVML reports them (``python -m agent gpu``)."""

    subcommand = "gpu"
    reads_config = False


class StandingLog(FactBase[dict[str, Any]]):
    """The last ``RESULT standing`` line of out/standing.log, as key=value pairs."""

    @staticmethod
    def default() -> dict[str, Any]:
        return {}

    def command(self, root: str) -> StringCommand:
        return StringCommand(
            "grep '^RESULT standing' ", QuoteString(f"{root}/out/standing.log"),
            "2>/dev/null | tail -n 1 || true",
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        line = "\n".join(output).strip()
        if not line:
            return {}
        fields: dict[str, Any] = {"line": line}
        for part in line.split()[2:]:
            key, sep, value = part.partition("=")
            if sep:
                fields[key] = value
        return fields


class NodeBinary(FactBase[dict[str, Any]]):
    """
    The node binary the pointer names and the one that runs: pointer path, the digest written
    beside it, the digest of the file itself, and the running node's sha16 from the status.
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return {}

    def command(self, root: str) -> StringCommand:
        return StringCommand("python3 -c", QuoteString(_NODE_PROBE), QuoteString(root), "|| true")

    def process(self, output: list[str]) -> dict[str, Any]:
        data = _json(output, "NodeBinary") if output else {}
        if not isinstance(data, dict):
            raise FactProcessError("NodeBinary: expected an object")
        return data


_NODE_PROBE = _HELPERS + r"""
pointer = text(os.path.join(root, "standing.node"))
digest = sha(pointer) if pointer else None
try:
    status = json.loads(text(os.path.join(root, "run", "status.json")) or "{}")
except ValueError:
    status = {}
node = (status.get("programs") or {}).get("node") or {}
print(json.dumps({
    "pointer": pointer,
    "pointer_sha256": text(os.path.join(root, "standing.node.sha256")),
    "file_sha256": digest,
    "running_sha16": node.get("sha16") or (status.get("node") or {}).get("sha16"),
    "running_binary": node.get("binary") or (status.get("node") or {}).get("binary"),
}))
"""


class NodeReadback(_AgentJson):
    """
    What the box runs, read from the processes themselves (``python -m agent readback``): the
    node's pid, what it executes (``exe``, or the script of an interpreted program) with that
    file's sha256, when it started, the version its status RPC reports and whether it is
    synced; the miner's and prover's digests; the pointer (its target and the digests written
    and found); whether the node started after the pointer was written; the last switch
    (from/to sha16, old exit, new start, synced, downtime). ``{}`` without an agent.
    """

    subcommand = "readback"
