"""Where things live on the box, under one configurable root (default /root/fleet)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_ROOT = Path("/root/fleet")
DEFAULT_CONFIG = DEFAULT_ROOT / "agent.toml"


class Layout:
    """Every path under the root, computed once (the loop asks for some of them each tick)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "agent.toml"
        self.inbox = root / "in"
        self.out = root / "out"
        self.run = root / "run"
        self.logs = root / "log"
        self.releases = root / "releases"
        self.standing_log = self.out / "standing.log"
        self.pointer = root / "standing.node"
        self.pointer_digest = root / "standing.node.sha256"
        self.status = self.run / "status.json"
        self.heartbeat = self.run / "heartbeat"  # its mtime is the heartbeat
        self.lock = self.run / "agent.lock"
        self.switch_lock = self.run / "switch.lock"  # held by `agent switch` while it runs
        self.agent_pid = self.run / "agent.pid"
        self.state = self.run / "state.json"
        self.agent_log = self.logs / "agent.log"
        self.recovery_log = self.logs / "recovery.log"
        self.pack_log = self.logs / "pack.log"
        self._pidfiles: dict[str, Path] = {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    def pidfile(self, program: str) -> Path:
        path = self._pidfiles.get(program)
        if path is None:
            path = self._pidfiles[program] = self.run / f"{program}.pid"
        return path

    def ensure(self) -> None:
        for d in (self.root, self.inbox, self.out, self.run, self.logs, self.releases):
            d.mkdir(parents=True, exist_ok=True)
