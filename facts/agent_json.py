"""The facts that print the agent CLI's JSON, as a command and a parser that need no pyinfra.

`facts.box`'s `AgentStatus`, `GpuIdentity` and `NodeReadback` are these in pyinfra's form
(their `command` and `process` call these). `fleet check` and the loop read every box's status
through the system's `ssh` (`fleet.boxes.boxssh.read_fact`) with `STATUS` itself: the same
command and parser, without importing pyinfra, which costs the healthy tick more CPU than the
rest of its own work.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from agent import contract

# the document a subcommand prints (agent.contract's TypedDicts)
Doc = TypeVar("Doc", bound=Mapping[str, Any])


class Unreadable(ValueError):
    """A fact's output is not what the fact prints (pyinfra's facts raise it as
    `FactProcessError`)."""


def load(output: list[str], what: str) -> Any:
    """The output's lines as one JSON document; `what` names the fact in the error."""
    try:
        return json.loads("\n".join(output))
    except json.JSONDecodeError as e:
        raise Unreadable(f"{what}: not JSON: {e}") from e


@dataclass(frozen=True)
class AgentJson(Generic[Doc]):
    """`<root>/venv/bin/python -m agent <subcommand> [--config ...]`, run from the root, and
    its JSON object, the subcommand's document (`{}` when no agent is installed: a reader
    asks `if not doc` before it reads a key). The object is taken as the document the agent
    writes, unchecked beyond being an object: its values are read defensively.

    + name: the fact's name, in its errors
    + subcommand: the agent CLI's command
    + reads_config: pass the agent's configuration (`--config`)

    Example: `STATUS.command("/root/fleet")`, then `STATUS.process(lines)`
    """

    name: str
    subcommand: str
    reads_config: bool = True

    def command(self, root: str) -> str:
        # the words pyinfra's StringCommand joins, the root quoted as its QuoteString quotes
        return " ".join((
            "cd", shlex.quote(root), f"2>/dev/null && test -x {contract.VENV_PYTHON} &&",
            f"{contract.VENV_PYTHON} -m agent", self.subcommand,
            f"--config {contract.CONFIG}" if self.reads_config else "", "|| true",
        ))

    def process(self, output: list[str]) -> Doc:
        if not output:
            return cast(Doc, {})
        data = load(output, self.name)
        if not isinstance(data, dict):
            raise Unreadable(f"{self.name}: expected an object")
        return cast(Doc, data)


STATUS: AgentJson[contract.StatusDoc] = AgentJson("AgentStatus", "status")
GPU: AgentJson[dict[str, Any]] = AgentJson("GpuIdentity", "gpu", reads_config=False)
READBACK: AgentJson[contract.ReadbackDoc] = AgentJson("NodeReadback", "readback")
