"""What the supervisor offers its policies (the pointer switch, recovery, the pack export).

A Protocol rather than the Supervisor class itself, so the policy modules never import the
supervisor (and the supervisor imports them, not the other way round).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agent.base.config import Config
from agent.base.files import DigestCache
from agent.base.persist import AgentState
from agent.contract import Layout
from agent.daemon.digests import DigestWorker
from agent.daemon.program import Program
from agent.daemon.tasks import Task


class Context(Protocol):
    cfg: Config
    layout: Layout
    state: AgentState
    digests: DigestCache  # hashes at once: for what a running process runs
    hasher: DigestWorker  # hashes off the loop: for the pointer's target and each node start

    @property
    def journal(self) -> Callable[[str], None]:
        """The agent's log (one UTC line per event)."""

    def save_state(self) -> bool:
        """Write the state durably; False (and the failure reported) when it cannot be."""

    def values(self, name: str = "") -> dict[str, str | None]:
        """The placeholder values for a program's command."""

    def program(self, name: str) -> Program | None:
        """The supervised program of that name, if configured."""

    def wanted(self, prog: Program) -> bool:
        """Whether the guards let the program run now."""

    def start_task(self, kind: str, argv: list[str], log: Path, timeout_s: float,
                   **record: Any) -> Task | None:
        """Start a one-off task and record it durably; None when it could not be both."""
