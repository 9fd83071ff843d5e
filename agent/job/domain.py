"""A step's kill domain: everything a step of a job starts dies when the step ends.

Each step (`job admit|fetch|scan|gate`, and the runner of `job run`) makes its own process a
child subreaper before it starts anything: a descendant that leaves its process group or its
session (`setsid`) is still reparented to the step when its parent exits, never to PID 1. When
a gate ends (passed, refused, timed out or stopped) and when the step itself ends, every
descendant the step still has is SIGKILLed and reaped, and the number killed goes into the
step's record. A step that cannot become a subreaper refuses to start the job's code: it could
not find what that code leaves behind.
"""

from __future__ import annotations

import os

import psutil

from agent.base.detach import become_subreaper

KIND = "subreaper"
ROUNDS = 20  # a killed process's own orphans come to us next: collect again, this many times
REAP_S = 5.0


class DomainError(Exception):
    """The step could not become the owner of its descendants."""


def enter() -> str:
    """Own every descendant of this process from now on; the domain's kind."""
    if not become_subreaper():
        raise DomainError("cannot become a child subreaper (prctl PR_SET_CHILD_SUBREAPER "
                          "failed): what the job's code starts could not be ended")
    return KIND


def kill_descendants(keep: set[int] | None = None) -> int:
    """SIGKILL and reap every descendant of this process (but the pids in `keep`, which the
    caller still waits on); how many were killed."""
    me = psutil.Process(os.getpid())
    keep = keep or set()
    killed: set[tuple[int, float]] = set()
    for _ in range(ROUNDS):
        try:
            found = [p for p in me.children(recursive=True) if p.pid not in keep]
        except psutil.Error:
            break
        if not found:
            break
        for p in found:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue  # it ended by itself: reaped below, not counted
                ident = (p.pid, p.create_time())
                p.kill()
            except psutil.Error:
                continue
            killed.add(ident)
        psutil.wait_procs(found, timeout=REAP_S)
    return len(killed)
