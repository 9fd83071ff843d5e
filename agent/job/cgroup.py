"""A cgroup v2 kill domain for the job's code: a process in it, and everything it ever starts,
stays in it whatever it does with its session, its parents or its environment, and the kernel
kills the lot at once (`cgroup.kill`, Linux 5.14+; before that: freeze, SIGKILL each member).

The domain is a new child of the agent's own cgroup (the `0::` line of /proc/self/cgroup) on a
writable cgroup2 mount (/proc/self/mountinfo). No controller is enabled in it, so the "no
internal processes" rule does not stop its creation beside the agent. Paths are recorded
relative to the hierarchy's root, so that another step, from another SSH session or mount
namespace, finds the same cgroup. None of this is available on a box without cgroup v2, with it
read-only (a container's usual view) or where the agent may not create a cgroup: the caller
falls back to a subreaper (agent.job.domain).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

PREFIX = "fleet-job-"
EMPTY_WAIT_S = 10.0  # after the kill: every member gone within this, or the domain failed
POLL_S = 0.02


class CgroupError(Exception):
    """The cgroup could not be emptied or removed: something of the job's may still run."""


def _mount() -> tuple[Path, str] | None:
    """(mount point, root in the hierarchy) of a writable cgroup2 mount, or None."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields, _, tail = line.partition(" - ")
        parts, rest = fields.split(), tail.split()
        if len(parts) < 6 or len(rest) < 1 or rest[0] != "cgroup2":
            continue
        if "rw" not in parts[5].split(",") or "ro" in rest[-1].split(","):
            continue
        return Path(parts[4].replace("\\040", " ")), parts[3]
    return None


def own() -> str | None:
    """This process's cgroup v2 path in the hierarchy ("/" at its root), or None."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n") or "/"
    except OSError:
        return None
    return None


def where(rel: str) -> Path | None:
    """The directory of the cgroup at `rel` in the hierarchy, as this process sees it."""
    found = _mount()
    if found is None:
        return None
    mount, root = found
    if root != "/" and not (rel == root or rel.startswith(root.rstrip("/") + "/")):
        return None
    inside = rel[len(root):] if root != "/" else rel
    return mount / inside.lstrip("/")


def planned(name: str) -> str | None:
    """The path in the hierarchy a cgroup `name` under this process's own would have, or None
    when this box has no writable cgroup v2 to make it in."""
    mine = own()
    if mine is None:
        return None
    rel = f"{mine.rstrip('/')}/{name}"
    return rel if where(rel) is not None else None


def create(rel: str) -> bool:
    """Make the cgroup; False when the kernel refuses (read-only, not permitted, no room)."""
    path = where(rel)
    if path is None:
        return False
    try:
        path.mkdir()
    except OSError:
        return False
    return (path / "cgroup.procs").exists()


def valid(rel: object) -> bool:
    """Whether a recorded path names a job's cgroup (never another: the record is a file on
    the box)."""
    return isinstance(rel, str) and rel.startswith("/") and ".." not in rel.split("/") \
        and rel.rsplit("/", 1)[-1].startswith(PREFIX)


def join(rel: str) -> None:
    """Move this process into the cgroup (in a child before it execs the job's code)."""
    path = where(rel)
    if path is None:
        raise OSError(f"cgroup {rel} is not reachable")
    with open(path / "cgroup.procs", "w") as f:
        f.write("0")


def kill(rel: str) -> int:
    """Kill every process in the cgroup (and in any cgroup its members made below it), until
    none is left; how many were killed (a member that had ended by itself is not counted).
    CgroupError when members remain after EMPTY_WAIT_S or the cgroup cannot be read."""
    path = where(rel)
    if path is None or not path.is_dir():
        return 0
    killed: set[tuple[int, float]] = set()
    until = time.monotonic() + EMPTY_WAIT_S
    while True:
        members = _members(path)
        if not members:
            return len(killed)
        for pid in members:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    killed.add((pid, p.create_time()))
            except psutil.Error:
                continue
        _kill_all(path, members)  # their zombies leave the cgroup: the subreaper reaps them
        if time.monotonic() >= until:
            raise CgroupError(f"{len(members)} process(es) still in cgroup {rel} "
                              f"{EMPTY_WAIT_S:.0f} s after they were killed")
        time.sleep(POLL_S)


def remove(rel: str) -> None:
    """Remove the (empty) cgroup and any its members made below it; CgroupError if it stays."""
    path = where(rel)
    if path is None or not path.exists():
        return
    try:
        for top, dirs, _ in os.walk(path, topdown=False):
            for d in dirs:
                os.rmdir(os.path.join(top, d))
        path.rmdir()
    except OSError as e:
        raise CgroupError(f"cgroup {rel} cannot be removed: {e.strerror or e}") from None


def _members(path: Path) -> set[int]:
    pids: set[int] = set()
    try:
        for top, _, files in os.walk(path):
            if "cgroup.procs" in files:
                with open(os.path.join(top, "cgroup.procs")) as f:
                    pids.update(int(x) for x in f.read().split())
    except (OSError, ValueError) as e:
        raise CgroupError(f"cannot read the members of cgroup {path}: {e}") from None
    return pids


def _kill_all(path: Path, members: set[int]) -> None:
    """cgroup.kill where the kernel has it; every member SIGKILLed by pid as well (what a
    kernel without it needs, frozen first so that none forks meanwhile, and what holds if the
    file does not act)."""
    kill_file, freeze = path / "cgroup.kill", path / "cgroup.freeze"
    if kill_file.exists():
        _write(kill_file, "1")
    else:
        _write(freeze, "1")
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    if not kill_file.exists():
        _write(freeze, "0")


def _write(path: Path, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        pass  # each member is SIGKILLed by pid too; what stays is found on the next look
