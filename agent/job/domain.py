"""A step's kill domain: everything a step of a job starts dies when the step ends.

Where the box has a writable cgroup v2 and the agent may create a cgroup in it, the step's
domain is a new cgroup (agent.job.cgroup), `fleet-job-<job>-<step>-<pid>` below the agent's own:
every process of the job's code the step starts (a gate, the run's command) joins it before it
execs, and nothing it does (setsid, a double fork, a cleared environment) takes it or what it
starts out. When a gate or the step ends, the cgroup is killed and waited until empty, counted,
and at the step's end removed; its path is recorded in the state (`cgroups`) before it is made,
so that whoever finds the step dead kills and removes it too. A cgroup that cannot be emptied
or removed fails the step: it is not clean, and the job goes no further. Without such a
cgroup (no cgroup v2, a read-only one as in most containers, or a refusal), the domain is the
subreaper below, and the step's record says which it had (`domain: cgroup|subreaper`).

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
import re
import secrets
import signal
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from agent.base import procs
from agent.base.detach import become_subreaper
from agent.job import cgroup

KIND = "subreaper"
CGROUP = "cgroup"
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
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


class Domain:
    """Where one step's job code runs: its cgroup (a path in the hierarchy), or None for the
    step's subreaper alone."""

    def __init__(self, rel: str | None) -> None:
        self.cgroup = rel
        self.kind = KIND if rel is None else CGROUP

    def preexec(self) -> Callable[[], None] | None:
        """For the child that execs the job's code: join the cgroup first (a child that cannot
        never execs, and its Popen fails)."""
        rel = self.cgroup
        return None if rel is None else (lambda: cgroup.join(rel))

    def clear(self, keep: set[int] | None = None) -> int:
        """Kill everything of the job's code in the domain now; how many. DomainError when the
        cgroup cannot be emptied."""
        killed = 0
        if self.cgroup is not None:
            try:
                killed += cgroup.kill(self.cgroup)
            except cgroup.CgroupError as e:
                raise DomainError(str(e)) from None
        return killed + kill_descendants(keep)  # and reap: the subreaper inherited them

    def close(self, state: dict[str, Any]) -> int:
        """clear(), then remove the cgroup (and forget it in `state["cgroups"]`)."""
        killed = self.clear()
        if self.cgroup is not None:
            try:
                cgroup.remove(self.cgroup)
            except cgroup.CgroupError as e:
                raise DomainError(str(e)) from None
            state["cgroups"] = [c for c in state.get("cgroups") or [] if c != self.cgroup]
        return killed


def open_domain(job_name: str, step: str, state: dict[str, Any],
                save: Callable[[], None]) -> Domain:
    """The step's domain: this process a subreaper (always), and a new cgroup where the box
    can give one, recorded in `state["cgroups"]` (saved) before it is made."""
    enter()
    name = UNSAFE.sub("_", f"{cgroup.PREFIX}{job_name}-{step}")[:200] + f"-{os.getpid()}"
    rel = cgroup.planned(name)
    if rel is None:
        return Domain(None)
    state["cgroups"] = [*(state.get("cgroups") or []), rel]
    save()
    return Domain(rel if cgroup.create(rel) else None)


def kill_cgroups(state: dict[str, Any]) -> tuple[int, str | None]:
    """Kill and remove every job cgroup the state records (a dead step's); (how many killed,
    the first that could not be emptied or removed, or None)."""
    killed, problem, left = 0, None, []
    for rel in state.get("cgroups") or []:
        if not cgroup.valid(rel):
            continue
        try:
            killed += cgroup.kill(rel)
            cgroup.remove(rel)
        except cgroup.CgroupError as e:
            problem = problem or str(e)
            left.append(rel)
    state["cgroups"] = left
    return killed, problem


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
    return kill_until_gone(
        lambda: [pid for pid in _pids() if pid not in spared and _carries(pid, needle)],
        lambda found: psutil.wait_procs(_alive(found), timeout=REAP_S))


def kill_until_gone(find: Callable[[], list[int]], wait: Callable[[list[int]], Any]) -> int:
    """SIGKILL what `find` names, `wait` for it, and again while it names any (a process
    may fork between the listing and the kill), ROUNDS at most; how many were killed."""
    killed: set[tuple[int, int]] = set()
    for _ in range(ROUNDS):
        found = find()
        if not found:
            break
        for pid in found:
            ticks = procs.start_ticks_of(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            killed.add((pid, ticks or -1))
        wait(found)
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
