"""What the agent remembers across its own restarts (run/state.json, replaced atomically).

The programs outlive the agent, so must the facts about them: which node binary is current and
why, which pointer was last acted on, which seed the miner's pack was exported for, when the
exec-snapshot recipe last ran, when the last RESULT line was written.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.files import read_json, write_json


@dataclass
class NodeBinary:
    path: str
    sha256: str
    source: str  # "pointer": named by standing.node; "adopted": found running, recorded

    @property
    def sha16(self) -> str:
        return self.sha256[:16]


@dataclass
class AgentState:
    node_binary: NodeBinary | None = None
    pointer_applied: str | None = None  # standing.node + digest text last switched to
    pack_seed: str | None = None  # the node seed the miner's pack was last exported for
    recovery: dict[str, Any] = field(default_factory=dict)  # runs, started_at, finished_at, ...
    last_result_at: float | None = None

    @classmethod
    def load(cls, path: Path) -> AgentState:
        raw = read_json(path)
        if not isinstance(raw, dict):
            return cls()
        binary = raw.get("node_binary")
        node_binary = None
        if isinstance(binary, dict) and {"path", "sha256", "source"} <= set(binary):
            node_binary = NodeBinary(str(binary["path"]), str(binary["sha256"]),
                                     str(binary["source"]))
        recovery = raw.get("recovery")
        last_result = raw.get("last_result_at")
        return cls(
            node_binary=node_binary,
            pointer_applied=_str_or_none(raw.get("pointer_applied")),
            pack_seed=_str_or_none(raw.get("pack_seed")),
            recovery=recovery if isinstance(recovery, dict) else {},
            last_result_at=float(last_result) if isinstance(last_result, int | float) else None,
        )

    def save(self, path: Path) -> None:
        write_json(path, asdict(self))


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
