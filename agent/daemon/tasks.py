"""One-off commands the agent runs beside the programs (the exec-snapshot recipe, the miner's
pack export): started in their own process group, output appended to a log, reaped by the
supervision loop like any child, killed at their deadline.

Each running task is recorded in the agent's state (pid and identity, see procs), so an agent
started after the previous one was SIGKILLed finds it again (`Task.adopt`) instead of starting a
second one beside it. An adopted task is not our child: its exit is seen through a pidfd (or by
polling) and its exit status is unknown.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

from agent.base import procs
from agent.base.stopping import Stopping


class Task:
    def __init__(self, kind: str, argv: list[str], pid: int, start_ticks: int,
                 started_at: float, timeout_s: float,
                 child: subprocess.Popen[bytes] | None) -> None:
        self.kind = kind
        self.argv = argv
        self.pid = pid
        self.start_ticks = start_ticks
        self.started_at = started_at
        self.timeout_s = timeout_s
        self.child = child
        self.adopted = child is None
        # the deadline counts from the real start, also for a task found after a restart
        self.deadline = time.monotonic() + max(0.0, started_at + timeout_s - time.time())
        self.timed_out = False
        self.stopping: Stopping | None = None
        self.pidfd = procs.pidfd(pid) if child is None else None

    @classmethod
    def start(cls, kind: str, argv: list[str], env: dict[str, str], cwd: str, log: str,
              timeout_s: float) -> Task:
        """Start argv in its own session with output appended to log (OSError if it cannot)."""
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            try:
                os.write(out, f"--- {kind}: {' '.join(argv)}\n".encode())
            except OSError:
                pass  # a full disk loses the header, not the task
            child = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            )
        finally:
            os.close(out)
        return cls(kind, argv, child.pid, procs.start_ticks_of(child.pid) or 0, time.time(),
                   timeout_s, child)

    @classmethod
    def adopt(cls, kind: str, record: dict[str, Any], timeout_s: float) -> Task | None:
        """The task a state record names, if that very process still runs: by its identity,
        or, for a record of the intent only (the agent died before it recorded the pid), by its
        command line, as the leader of its own session (tasks start in one)."""
        info = procs.from_record(record)
        argv = record.get("argv")
        if info is None and record.get("pid") is None and isinstance(argv, list) and argv:
            info = _leader_running([str(a) for a in argv])
        if info is None:
            return None
        # its age from the boot clock (the process's own start), never the recorded wall
        # time: a clock step either way between two agents neither kills nor extends it
        started_at = time.time() - info.age_s
        return cls(kind, [str(a) for a in argv] if isinstance(argv, list) else list(info.argv),
                   info.pid, info.start_ticks, started_at, timeout_s, None)

    def record(self, **extra: Any) -> dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "boot_id": procs.boot_id(),
                "argv": self.argv, "started_at": self.started_at, **extra}

    def alive(self) -> bool:
        return procs.is_same(self.pid, self.start_ticks)

    def stop(self, why: str, journal: Callable[[str], None]) -> None:
        """Kill the task's group now (it is then waited for like any exit)."""
        if self.stopping is None:
            self.stopping = Stopping(self.kind, self.pid, self.pid, 0.0, why, journal)

    def enforce_deadline(self, now: float, journal: Callable[[str], None]) -> None:
        if self.stopping is not None:
            self.stopping.enforce(now)
        elif now >= self.deadline:
            self.timed_out = True
            self.stopping = Stopping(self.kind, self.pid, self.pid, 0.0,
                                     f"timed out after {self.timeout_s:.0f} s", journal, now)

    def wake_at(self) -> float:
        """When the loop must look at this task again (its timeout or the next SIGKILL)."""
        return self.stopping.deadline if self.stopping is not None else self.deadline

    def finished(self, code: int | None) -> None:
        if self.child is not None:
            self.child.returncode = code  # reaped by the loop
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        procs.kill_group_leftovers(self.pid)


def _leader_running(argv: list[str]) -> procs.ProcInfo | None:
    """A session leader whose command line ends with argv (a script's interpreter is put in
    front of it by the kernel), or None."""
    n = len(argv)
    for pid, raw in procs.command_lines():
        if list(procs.split_cmdline(raw)[-n:]) == argv:
            info = procs.identify(pid)
            if info is not None and info.pgid == pid:
                return info
    return None
