"""One-off commands the agent runs beside the programs (the exec-snapshot recipe, the miner's
pack export): started in their own process group, output appended to a log, reaped by the
supervision loop like any child, killed at their deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from agent import procs


class Task:
    def __init__(self, kind: str, argv: list[str], env: dict[str, str], cwd: str, log: str,
                 timeout_s: float) -> None:
        self.kind = kind
        self.argv = argv
        self.started_at = time.time()
        self.deadline = time.monotonic() + timeout_s
        self.timed_out = False
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            os.write(out, f"--- {kind}: {' '.join(argv)}\n".encode())
            self.child = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            )
        finally:
            os.close(out)
        self.pid = self.child.pid

    def enforce_deadline(self, now: float) -> None:
        if not self.timed_out and now >= self.deadline:
            self.timed_out = True
            procs.signal_program(self.pid, self.pid, signal.SIGKILL)

    def finished(self, code: int | None) -> None:
        self.child.returncode = code  # reaped by the loop
        procs.kill_group_leftovers(self.pid)
