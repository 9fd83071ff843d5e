"""The agent's own log: one UTC-stamped line per event in log/agent.log (O_APPEND)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def utc_ms(ts: float) -> str:
    """UTC ISO-8601 with a Z, to the millisecond (a switch's timeline)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def utc(ts: float | None = None) -> str:
    """UTC ISO-8601 with a Z, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


class Journal:
    def __init__(self, path: Path, echo: bool = False) -> None:
        self.path = path
        self.echo = echo
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def __call__(self, message: str) -> None:
        line = f"{utc()} {message}\n"
        try:
            os.write(self._fd, line.encode(errors="replace"))
        except OSError:
            pass
        if self.echo:
            self._echo(line)

    def _echo(self, line: str) -> None:
        """A copy on stderr (--foreground); a closed stderr (EPIPE) ends the echo, never the
        agent: the log file goes on."""
        try:
            os.write(sys.stderr.fileno(), line.encode(errors="replace"))
        except (OSError, ValueError) as e:
            self.echo = False
            note = f"{utc()} stderr closed ({getattr(e, 'strerror', None) or e}); echo off\n"
            try:
                os.write(self._fd, note.encode(errors="replace"))
            except OSError:
                pass

    def close(self) -> None:
        os.close(self._fd)
