"""What the agent remembers across its own restarts (run/state.json, replaced atomically).

The programs outlive the agent, so must the facts about them: which node binary is current and
why, which pointer was last acted on, which seed the miner's pack was exported for, when the
exec-snapshot recipe last ran, when the last RESULT line was written, and which one-off tasks
(the recipe, a pack export) are running, so that an agent started after a SIGKILL finds them.

Wall-clock times are kept as wall-clock times (they outlive the process, a monotonic clock does
not), so a clock stepped backwards can leave them in the future: `clamp_future` puts them back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.files import read_json, write_json

FUTURE_SLACK_S = 60.0  # a recorded time further ahead than this is a clock step, not drift


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
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> Task.record()
    switch: dict[str, Any] = field(default_factory=dict)  # the last switch's timeline

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
        tasks = raw.get("tasks")
        switch = raw.get("switch")
        return cls(
            node_binary=node_binary,
            pointer_applied=_str_or_none(raw.get("pointer_applied")),
            pack_seed=_str_or_none(raw.get("pack_seed")),
            recovery=recovery if isinstance(recovery, dict) else {},
            last_result_at=float(last_result) if isinstance(last_result, int | float) else None,
            tasks={k: v for k, v in tasks.items() if isinstance(v, dict)}
            if isinstance(tasks, dict) else {},
            switch=switch if isinstance(switch, dict) else {},
        )

    def clamp_future(self, now: float) -> list[str]:
        """Wall-clock times recorded before a backwards clock step lie in the future and would
        hold a timer back for as long as the step: the RESULT line's is dropped (one is due),
        the recipe's are set to now (its cooldown restarts). Returns what was changed."""
        changed = []
        if self.last_result_at is not None and self.last_result_at > now + FUTURE_SLACK_S:
            changed.append("last_result_at")
            self.last_result_at = None
        for key in ("started_at", "finished_at"):
            value = self.recovery.get(key)
            if isinstance(value, int | float) and value > now + FUTURE_SLACK_S:
                changed.append(f"recovery.{key}")
                self.recovery[key] = now
        return changed

    def save(self, path: Path) -> None:
        """Durably (fsync): a switch or a task is acted on only once this returns."""
        write_json(path, asdict(self), durable=True)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
