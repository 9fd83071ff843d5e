"""The one way the agent stops a process (a program, a task, a stray, `agent stop`).

SIGTERM to the process group (to the process alone when it leads none), SIGKILL when the grace
runs out, and SIGKILL again every KILL_WAIT_S for as long as the process is still there (it is
in uninterruptible sleep: even SIGKILL waits for the kernel). Each escalation is one line in the
agent log. The next deadline always lies in the future, so a loop that waits for it never
busy-waits, however long the process takes to go.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from agent.base import procs

KILL_WAIT_S = 5.0  # after SIGKILL, how long before it is sent again (and said so)


class Stopping:
    def __init__(self, label: str, pid: int, pgid: int, grace_s: float, why: str,
                 journal: Callable[[str], None], now: float | None = None) -> None:
        """Begin the stop now: SIGTERM, or SIGKILL at once when there is no grace."""
        self.label = label
        self.pid = pid
        self.pgid = pgid
        self.grace_s = grace_s
        self.journal = journal
        self.kills = 0
        self.killed_at = 0.0  # monotonic time of the last SIGKILL
        now = time.monotonic() if now is None else now
        self.deadline = now + grace_s
        if grace_s > 0:
            journal(f"{label}: stopping pid {pid} ({why})")
            procs.signal_program(pid, pgid, signal.SIGTERM)
        else:
            journal(f"{label}: killing pid {pid} ({why})")
            self._kill(now)

    @property
    def killed(self) -> bool:
        return self.kills > 0

    def enforce(self, now: float) -> None:
        """Escalate when the deadline has come (call it whenever the loop wakes)."""
        if now < self.deadline:
            return
        if self.kills == 0:
            self.journal(f"{self.label}: pid {self.pid} ignored SIGTERM; sending SIGKILL "
                         f"(its {self.grace_s:g} s grace is over)")
        else:
            self.journal(f"{self.label}: pid {self.pid} still there "
                         f"{now - self.killed_at:.1f} s after SIGKILL (uninterruptible "
                         "sleep?); sending it again")
        self._kill(now)

    def _kill(self, now: float) -> None:
        procs.signal_program(self.pid, self.pgid, signal.SIGKILL)
        self.kills += 1
        self.killed_at = now
        self.deadline = now + KILL_WAIT_S

    def waiting_reason(self) -> str:
        """Why whatever waits for this process is waiting (a status reason)."""
        if self.kills:
            return f"waiting for pid {self.pid} to exit (it survived SIGKILL {self.kills} time(s))"
        return f"waiting for pid {self.pid} to exit"
