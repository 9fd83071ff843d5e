"""What the agent remembers across its own restarts (run/state.json, replaced atomically).

The programs outlive the agent, so must the facts about them: which node binary is current and
why, which pointer was last acted on, which seed the miner's pack was exported for, when the
exec-snapshot recipe last ran, when the last RESULT line was written, and which one-off tasks
(the recipe, a pack export) are running, so that an agent started after a SIGKILL finds them.

Wall-clock times are kept as wall-clock times (they outlive the process, a monotonic clock does
not), so a clock stepped backwards can leave them in the future: `clamp_future` puts them back.
The agent's timers run on the monotonic clock; these times only seed them at a start.

Nothing read from the file is trusted: every number must be finite and in range (a time between
the epoch and year 5138, a count or pid a 64-bit integer), every record the right shape. What is
not is dropped (reported by `load`'s caller), never carried into a timer or the status.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.base.files import read_json, write_json

FUTURE_SLACK_S = 60.0  # a recorded time further ahead than this is a clock step, not drift
LATEST_TIME = 1e11  # seconds since the epoch (year 5138): beyond this a time is garbage
LARGEST_INT = 2**63
TIME_KEYS = ("started_at", "finished_at", "applied_at", "old_exit_at", "new_started_at",
             "synced_at", "at")


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
        return cls.from_raw(read_json(path))[0]

    @classmethod
    def from_raw(cls, raw: Any) -> tuple[AgentState, list[str]]:
        """The state a parsed state.json holds, and what in it was garbage (dropped)."""
        dropped: list[str] = []
        if not isinstance(raw, dict):
            return cls(), ([] if raw is None else ["the whole file (not an object)"])
        binary = raw.get("node_binary")
        node_binary = None
        if isinstance(binary, dict) and all(isinstance(binary.get(k), str)
                                            for k in ("path", "sha256", "source")) \
                and _sane_path(binary["path"]):
            node_binary = NodeBinary(binary["path"], binary["sha256"], binary["source"])
        elif binary is not None:
            dropped.append("node_binary")
        last_result = _time(raw.get("last_result_at"))
        if raw.get("last_result_at") is not None and last_result is None:
            dropped.append("last_result_at")
        tasks = raw.get("tasks")
        return cls(
            node_binary=node_binary,
            pointer_applied=_str_or_none(raw.get("pointer_applied")),
            pack_seed=_str_or_none(raw.get("pack_seed")),
            recovery=_record(raw.get("recovery"), "recovery", dropped),
            last_result_at=last_result,
            tasks={k: _record(v, f"tasks.{k}", dropped) for k, v in tasks.items()
                   if isinstance(v, dict)} if isinstance(tasks, dict) else {},
            switch=_record(raw.get("switch"), "switch", dropped),
        ), dropped

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


def _sane_path(path: str) -> bool:
    """An absolute path without a NUL byte (one would make every stat raise ValueError)."""
    return path.startswith("/") and "\0" not in path


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _time(value: Any) -> float | None:
    """A recorded wall-clock time, or None when it is not one (NaN, 1e300, negative, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= LATEST_TIME else None


def _record(value: Any, where: str, dropped: list[str]) -> dict[str, Any]:
    """A flat record with every number checked: times by _time, other numbers finite and
    within a 64-bit integer; a value that is not is dropped (its key left out)."""
    if not isinstance(value, dict):
        if value is not None:
            dropped.append(where)
        return {}
    out = {}
    for key, item in value.items():
        if key in TIME_KEYS and item is not None:
            if _time(item) is None:
                dropped.append(f"{where}.{key}")
                continue
        elif isinstance(item, float | int) and not isinstance(item, bool) and not (
                math.isfinite(item) and abs(item) < LARGEST_INT):
            dropped.append(f"{where}.{key}")
            continue
        elif isinstance(item, dict | list) and not _sane(item):
            dropped.append(f"{where}.{key}")
            continue
        out[key] = item
    return out


def _sane(value: Any) -> bool:
    """Every number inside is finite and within a 64-bit integer (iterative: a record nested
    as deep as the JSON parser allows must not overflow the stack here)."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, float | int) and not isinstance(item, bool) and not (
                math.isfinite(item) and abs(item) < LARGEST_INT):
            return False
    return True
