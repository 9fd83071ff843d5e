"""Becoming a proper daemon: detached from the SSH session, and the reaper of orphans."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of our programs' descendants get reparented to us (not to PID 1, which in a
    container often never reaps), and the agent reaps them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def detach(log_path: Path) -> Callable[[str], None]:
    """Fork twice and continue in a grandchild in its own session, with stdin from /dev/null
    and stdout/stderr appended to log_path.

    The caller (an SSH command, say) waits until the daemon reports; `report("ok ...")` makes it
    print the rest and exit 0, any other text is printed as the error and it exits 1. Nothing
    the daemon holds keeps the caller's terminal or pipes open, so `ssh box python -m agent run`
    returns at once and the agent outlives the session (no SIGHUP reaches a new session).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(write_end)
        os.waitpid(pid, 0)
        chunks = []
        while chunk := os.read(read_end, 4096):
            chunks.append(chunk)
        message = b"".join(chunks).decode(errors="replace").strip()
        if message.startswith("ok"):
            print(message[2:].strip(), flush=True)
            os._exit(0)
        print(message or "error: the agent died while starting (see its log)", file=sys.stderr,
              flush=True)
        os._exit(1)
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def report(message: str) -> None:
        nonlocal write_end
        if write_end < 0:
            return
        try:
            os.write(write_end, message.encode())
        finally:
            os.close(write_end)
            write_end = -1

    return report
