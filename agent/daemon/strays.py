"""Strays: processes that are a program but must not run (a duplicate, the old node of a
switch, a GPU program admission refuses). Each is stopped the one way (stopping.py) and
forgotten once gone; the supervisor polls them (they are not ours to wait on) at STRAY_POLL_S
while any is left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from agent.base import procs
from agent.base.stopping import Stopping

STRAY_POLL_S = 0.2


@dataclass
class Stray:
    program: str
    pid: int
    pgid: int
    start_ticks: int
    stopping: Stopping
    sha256: str | None = None  # the node's digest, for a switch's timeline


class Strays:
    def __init__(self, journal: Callable[[str], None]) -> None:
        self.journal = journal
        self._by_pid: dict[int, Stray] = {}

    def __bool__(self) -> bool:
        return bool(self._by_pid)

    def __contains__(self, pid: int) -> bool:
        return pid in self._by_pid

    def __iter__(self) -> Iterator[Stray]:
        return iter(list(self._by_pid.values()))

    def pids(self) -> set[int]:
        return set(self._by_pid)

    def of(self, program: str) -> list[Stray]:
        return [s for s in self._by_pid.values() if s.program == program]

    def add(self, program: str, info: procs.ProcInfo, grace_s: float, why: str,
            sha256: str | None = None) -> None:
        if info.pid in self._by_pid:
            return
        stopping = Stopping(program, info.pid, info.pgid, grace_s,
                            f"{why}: {' '.join(info.argv)}", self.journal)
        self._by_pid[info.pid] = Stray(program, info.pid, info.pgid, info.start_ticks, stopping,
                                       sha256)

    def forget(self, pid: int) -> None:
        self._by_pid.pop(pid, None)

    def check(self, now: float) -> list[Stray]:
        """Escalate the ones past their deadline; return (and forget) the ones that are gone."""
        gone = []
        for stray in self:
            if not procs.is_same(stray.pid, stray.start_ticks):
                del self._by_pid[stray.pid]
                procs.kill_group_leftovers(stray.pgid if stray.pgid == stray.pid else -1)
                gone.append(stray)
            else:
                stray.stopping.enforce(now)
        return gone
