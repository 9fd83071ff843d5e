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
from dataclasses import dataclass
from typing import Any

from agent import contract


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
class AgentJson:
    """`<root>/venv/bin/python -m agent <subcommand> [--config ...]`, run from the root, and
    its JSON object (`{}` when no agent is installed).

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

    def process(self, output: list[str]) -> dict[str, Any]:
        if not output:
            return {}
        data = load(output, self.name)
        if not isinstance(data, dict):
            raise Unreadable(f"{self.name}: expected an object")
        return data


STATUS = AgentJson("AgentStatus", "status")
GPU = AgentJson("GpuIdentity", "gpu", reads_config=False)
READBACK = AgentJson("NodeReadback", "readback")
