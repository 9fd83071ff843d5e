"""Facts about a fleet box, read in one SSH command each.

Every fact here is one command and one `process`, in pyinfra's manner. `BoxState` is the
deploy's workhorse: one round trip tells every operation of the standing deploy what the box
already has, which is what keeps a no-change re-run to a single command per box.
"""

from __future__ import annotations

from typing import Any, cast

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.command import QuoteString
from pyinfra.api.exceptions import FactProcessError

from agent import contract
from facts import agent_json, probes


def _at(root: str, relative: str) -> str:
    return f"{root}/{relative}"


def _probe(name: str, *args: str) -> StringCommand:
    """`python3 -c <facts/probes/NAME.py> ARGS`, every argument quoted."""
    return StringCommand("python3 -c", QuoteString(probes.source(name)),
                         *(QuoteString(a) for a in args))


def _pointer_and_status(root: str) -> tuple[str, ...]:
    return ("--pointer", _at(root, contract.POINTER),
            "--pointer-sha256", _at(root, contract.POINTER_DIGEST),
            "--status", _at(root, contract.STATUS))


def _json(output: list[str], what: str) -> Any:
    try:
        return agent_json.load(output, what)
    except agent_json.Unreadable as e:
        raise FactProcessError(str(e)) from e


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
        probe = _probe(
            "box", "state",
            "--bundle", _at(root, f"{contract.AGENT_CODE}/{contract.BUNDLE_STAMP}"),
            "--venv", _at(root, contract.VENV_PYTHON),
            "--releases", _at(root, contract.RELEASES),
            "--agent-pid", _at(root, contract.AGENT_PID),
            *_pointer_and_status(root), *files,
        )
        return StringCommand("if command -v python3 >/dev/null 2>&1; then", probe,
                             "; else echo '{\"python3\": null}'; fi")

    def process(self, output: list[str]) -> dict[str, Any]:
        data = _json(output, "BoxState")
        if not isinstance(data, dict):
            raise FactProcessError("BoxState: expected an object")
        return data


class _AgentJson(FactBase[agent_json.Doc]):
    """Base of the facts that print the agent CLI's JSON (``{}`` when no agent is installed):
    the command and the parser of ``plain`` (`facts.agent_json`), which readers without
    pyinfra run as they are."""

    abstract = True
    plain: agent_json.AgentJson[agent_json.Doc]

    @staticmethod
    def default() -> agent_json.Doc:
        return cast(agent_json.Doc, {})

    def command(self, root: str) -> StringCommand:
        return StringCommand(self.plain.command(root))

    def process(self, output: list[str]) -> agent_json.Doc:
        try:
            return self.plain.process(output)
        except agent_json.Unreadable as e:
            raise FactProcessError(str(e)) from e


class AgentStatus(_AgentJson[contract.StatusDoc]):
    """The agent's status (``python -m agent status``): programs, node, admission, heartbeat."""

    plain = agent_json.STATUS


class GpuIdentity(_AgentJson[dict[str, Any]]):
    """The box's driver and GPUs as NVML reports them (``python -m agent gpu``)."""

    plain = agent_json.GPU


class StandingLog(FactBase[dict[str, Any]]):
    """The last ``RESULT standing`` line of out/standing.log, as key=value pairs."""

    @staticmethod
    def default() -> dict[str, Any]:
        return {}

    def command(self, root: str) -> StringCommand:
        return StringCommand(
            "grep '^RESULT standing' ", QuoteString(_at(root, contract.STANDING_LOG)),
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


class HostKeys(FactBase[dict[str, Any]]):
    """
    The box's SSH host keys and the copies kept under the fleet's root: for each of
    ``/etc/ssh`` (``etc``) and ``<root>/ssh-host-keys`` (``kept``), ``{name: [mode, sha256]}``
    of every ``ssh_host_*`` file in it (mode in octal, as ``stat`` prints it).
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return {"etc": {}, "kept": {}}

    def command(self, root: str) -> StringCommand:
        listing = ('for f in ssh_host_*; do [ -f "$f" ] && '
                   'echo "$w $(stat -c %a "$f") $(sha256sum < "$f" | cut -c1-64) $f"; done')
        return StringCommand(
            f"for w in etc kept; do (if [ $w = etc ]; then cd {contract.SSH_DIR}; else cd",
            QuoteString(_at(root, contract.HOST_KEYS)),
            f"; fi 2>/dev/null && {listing}); done; true")

    def process(self, output: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"etc": {}, "kept": {}}
        for line in output:
            parts = line.split()
            if len(parts) != 4 or parts[0] not in out:
                raise FactProcessError(f"HostKeys: unexpected line {line!r}")
            out[parts[0]][parts[3]] = [parts[1], parts[2]]
        return out


class NodeBinary(FactBase[dict[str, Any]]):
    """
    The node binary the pointer names and the one that runs: pointer path, the digest written
    beside it, the digest of the file itself, and the running node's sha16 from the status.
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return {}

    def command(self, root: str) -> StringCommand:
        probe = _probe("box", "node", "--node", contract.NODE, *_pointer_and_status(root))
        return StringCommand(probe, "|| true")

    def process(self, output: list[str]) -> dict[str, Any]:
        data = _json(output, "NodeBinary") if output else {}
        if not isinstance(data, dict):
            raise FactProcessError("NodeBinary: expected an object")
        return data


class NodeReadback(_AgentJson[contract.ReadbackDoc]):
    """
    What the box runs, read from the processes themselves (``python -m agent readback``): the
    node's pid, what it executes (``exe``, or the script of an interpreted program) with that
    file's sha256, when it started, the version its status RPC reports and whether it is
    synced; the miner's and prover's digests; the pointer (its target and the digests written
    and found); whether the node started after the pointer was written; the last switch
    (from/to sha16, old exit, new start, synced, downtime). ``{}`` without an agent.
    """

    plain = agent_json.READBACK
