"""A step's kill domain: everything a step of a job starts dies when the step ends.

Each step (`job admit|fetch|scan|gate`, and the runner of `job run`) makes its own process a
child subreaper before it starts anything: a descendant that leaves its process group or its
session (`setsid`) is still reparented to the step when its parent exits, never to PID 1. When
a gate ends (passed, refused, timed out or stopped) and when the step itself ends, every
descendant the step still has is SIGKILLed and reaped, and the number killed goes into the
step's record. A step that cannot become a subreaper refuses to start the job's code: it could
not find what that code leaves behind.

A step that dies without its cleanup (SIGKILL, a reboot of the agent's process) takes its
subreaper role with it, and what it started is reparented away. So every process of the job's
code also carries the job's mark in its environment (`FLEET_JOB_DOMAIN=<random per job>`, an
opaque token that names nothing): whoever finds such a step dead (the next step, `job stop`, a
run found interrupted) kills every process carrying the mark (`strays` in the state). A process
that clears its own environment escapes this second net, not the first.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Mapping

import psutil

from agent.base import procs
from agent.base.detach import become_subreaper

KIND = "subreaper"
MARK = "FLEET_JOB_DOMAIN"
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


def new_mark() -> str:
    return secrets.token_hex(16)


def environment(mark: str) -> Mapping[str, str]:
    """The environment of the job's code: this process's, with the job's mark."""
    return {**os.environ, MARK: mark}


def kill_marked(mark: str) -> int:
    """SIGKILL every process whose environment carries the job's mark (but this process and
    its ancestors); how many. Reaped by whoever is their parent now."""
    if not mark:
        return 0
    needle = f"{MARK}={mark}".encode()
    spared = _ancestors()
    killed: set[tuple[int, int]] = set()
    for _ in range(ROUNDS):
        found = [pid for pid in _pids() if pid not in spared and _carries(pid, needle)]
        if not found:
            break
        for pid in found:
            stat = procs.start_ticks_of(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            killed.add((pid, stat or -1))
        psutil.wait_procs(_alive(found), timeout=REAP_S)
    return len(killed)


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def _ancestors() -> set[int]:
    spared, pid = set(), os.getpid()
    while pid > 1 and pid not in spared:
        spared.add(pid)
        info = procs.identify(pid)
        if info is None:
            break
        pid = info.ppid
    return spared


def _alive(pids: list[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return out
