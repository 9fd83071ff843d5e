"""One agent per box: an exclusive flock on run/agent.lock, held for the agent's lifetime.

The kernel drops the lock when the holder dies, however it dies, so a stale lock file never
blocks a new agent. The descriptor is close-on-exec: programs never inherit the lock.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


class AgentLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, wait: bool = False) -> bool:
        """Take the lock; without `wait`, False at once when another process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def acquire_within(self, wait_s: float, poll_s: float = 0.2) -> bool:
        """Take the lock within `wait_s`, polled (a blocking flock has no timeout)."""
        deadline = time.monotonic() + wait_s
        while not self.acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
