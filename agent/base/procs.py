"""Processes: identity that survives PID reuse, finding programs by command line, signalling.

A process is identified by (pid, start_ticks, boot_id): its start time in clock ticks since
boot, read from /proc/<pid>/stat, and the kernel's boot id. Neither depends on the wall clock,
so an NTP step never makes a live process look gone (a create time derived from `btime` moves
with every step). A record whose start ticks or boot id do not match the live process with
that pid names a process that is gone and whose pid was reused.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

INTERPRETER = re.compile(r"^(sh|bash|dash|env|python[0-9.]*|perl[0-9.]*|ruby[0-9.]*)$")


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_BOOT_ID: str | None = None


def boot_id() -> str:
    """The kernel's random id of this boot: start ticks only compare within one boot."""
    global _BOOT_ID
    if _BOOT_ID is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _BOOT_ID = f.read().strip()
        except OSError:
            _BOOT_ID = ""
    return _BOOT_ID


def uptime_s() -> float:
    """Seconds since boot on the clock that start ticks count (CLOCK_BOOTTIME)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    start_ticks: int  # start time in clock ticks since boot (/proc/<pid>/stat field 22)
    argv: tuple[str, ...]
    pgid: int
    ppid: int

    @property
    def age_s(self) -> float:
        return max(0.0, uptime_s() - self.start_ticks / _CLOCK_TICKS)

    def record(self) -> dict[str, int | str]:
        """What a pidfile or state record keeps to find this very process again."""
        return {"pid": self.pid, "start_ticks": self.start_ticks, "boot_id": boot_id()}


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, start_ticks) from one read of /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19])
    except (IndexError, ValueError):
        return None


def identify(pid: int) -> ProcInfo | None:
    """The live (non-zombie) process with this pid, or None."""
    stat = _stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = split_cmdline(f.read())
    except OSError:
        return None
    return ProcInfo(pid, stat[3], argv, stat[2], stat[1])


def is_same(pid: int, start_ticks: int) -> bool:
    """True when pid still names the process started at start_ticks (and is not a zombie)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[3] == start_ticks


def start_ticks_of(pid: int) -> int | None:
    stat = _stat(pid)
    return None if stat is None else stat[3]


def from_record(record: object) -> ProcInfo | None:
    """The live process a pidfile or state record names, or None when it is gone, the pid was
    reused, the machine rebooted since, or the record lacks the identity (an older format)."""
    if not isinstance(record, dict):
        return None
    pid, ticks, boot = record.get("pid"), record.get("start_ticks"), record.get("boot_id")
    if not isinstance(pid, int) or isinstance(ticks, bool) or not isinstance(ticks, int):
        return None
    if boot != boot_id():
        return None
    info = identify(pid)
    return info if info is not None and info.start_ticks == ticks else None


def split_cmdline(raw: bytes) -> tuple[str, ...]:
    return tuple(a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")) if raw else ()


def executable_index(argv: Sequence[str]) -> int | None:
    """Index of the argument naming the program: argv[0], or the script after an interpreter
    (python3 -u /x/miner.py -> 2)."""
    if not argv:
        return None
    if INTERPRETER.match(os.path.basename(argv[0])):
        for i, arg in enumerate(argv[1:], start=1):
            if not arg.startswith("-"):
                return i
    return 0


def executable_arg(argv: Sequence[str]) -> str | None:
    i = executable_index(argv)
    return None if i is None else argv[i]


def script_index(argv: Sequence[str], under_env: bool = False) -> int | None:
    """Index of the script a process under an interpreter runs: the first argument after
    argv[0] that is not an option. Never argv[0]: an interpreter's argv[0] is whatever its
    caller chose (`exec -a`), so a program cannot pass for a script by naming it there.
    `under_env`: the process is still `env` (a `#!/usr/bin/env python3` script in the moment
    before env execs its interpreter), so the first word that is neither an option nor a
    NAME=value is that interpreter, and the script is the next."""
    skip = under_env
    for i, arg in enumerate(argv[1:], start=1):
        if arg.startswith("-") or (under_env and "=" in arg and not arg.startswith("/")):
            continue
        if skip:
            skip = False
            continue
        return i
    return None


def binary_of(info: ProcInfo, interpreted: bool = False, under_env: bool = False) -> str | None:
    """Absolute path of the program file a process runs (the script for interpreted ones;
    `interpreted`: its exe is known to be an interpreter; `under_env`: that is `env`)."""
    i = script_index(info.argv, under_env) if interpreted else executable_index(info.argv)
    arg = None if i is None else info.argv[i]
    if not arg:
        return None
    if not os.path.isabs(arg):
        try:
            arg = os.path.join(psutil.Process(info.pid).cwd(), arg)
        except psutil.Error:
            return None
    return os.path.normpath(arg)


def running_file(info: ProcInfo) -> tuple[str | None, str | None, str]:
    """What a process runs: (its path, the file to hash, kind). For a binary ("exe") the file
    to hash is /proc/<pid>/exe, the very file the process maps even if its path was replaced
    since; for a script under an interpreter ("script"), the script it was started with."""
    try:
        exe: str | None = os.readlink(f"/proc/{info.pid}/exe").removesuffix(" (deleted)")
    except OSError:
        exe = None
    if exe is None:
        script = binary_of(info)
        return script, script, "script"
    name = os.path.basename(exe).split(" ")[0]
    if INTERPRETER.match(name):
        script = binary_of(info, interpreted=True, under_env=name == "env")
        return script, script, "script"
    return exe, f"/proc/{info.pid}/exe", "exe"


def running_identity(info: ProcInfo) -> tuple[object, ...] | None:
    """What a process runs, cheaply: the kind, path, device and inode of the file it runs
    (see running_file), of its exe (the interpreter of a script), and its command line; None
    when that file cannot be looked at. Equal identities need no new digest: a running binary
    cannot be written to in place."""
    path, source, kind = running_file(info)
    if not source:
        return None
    try:
        st = os.stat(source)
        exe = os.stat(f"/proc/{info.pid}/exe")
    except OSError:
        return None
    return kind, path, st.st_dev, st.st_ino, exe.st_dev, exe.st_ino, info.argv


def running_digest(info: ProcInfo,
                   digest: Callable[[str], tuple[str, os.stat_result]]
                   ) -> tuple[str | None, str | None, str]:
    """(path, sha256, kind) of what a process runs (see running_file); the sha256 is None when
    the file cannot be read. `digest` returns a file's sha256 and the fstat of the fd it
    hashed. For a script this is the script as it is now: a process's start time cannot be
    set against the file's ctime where the box's boot clock is its own (a container's time
    namespace), so a script changed after its process started is not told apart."""
    path, source, kind = running_file(info)
    if not source:
        return path, None, kind
    try:
        sha256, _ = digest(source)
    except OSError:
        return path, None, kind
    return path, sha256, kind


@dataclass(frozen=True)
class Matcher:
    """A test "this process (pid, argv) is the program". Command lines lacking `needle` can
    never match, which lets a scan skip most processes without decoding them."""

    test: Callable[[int, Sequence[str]], bool]
    needle: bytes = b""

    def __call__(self, pid: int, argv: Sequence[str]) -> bool:
        return self.test(pid, argv)


def regex_matcher(pattern: str) -> Matcher:
    """The configured `match`: a regex searched in the space-joined command line."""
    regex = re.compile(pattern)
    return Matcher(lambda pid, argv: bool(argv) and regex.search(" ".join(argv)) is not None)


def path_matcher(name: str, accept: Callable[[str], bool],
                 args: Sequence[str] | None = None) -> Matcher:
    """Processes whose program file (see executable_index) is called `name` and whose
    absolute, normalised path `accept` takes; with `args`, the arguments after the program
    file must be exactly these. Relative paths are resolved against the process's cwd."""
    wanted_args = None if args is None else tuple(args)

    def matches(pid: int, argv: Sequence[str]) -> bool:
        i = executable_index(argv)
        if i is None or os.path.basename(argv[i]) != name:
            return False
        if wanted_args is not None and tuple(argv[i + 1 :]) != wanted_args:
            return False
        arg = argv[i]
        if not os.path.isabs(arg):
            try:
                arg = os.path.join(os.readlink(f"/proc/{pid}/cwd"), arg)
            except OSError:
                return False
        return accept(os.path.normpath(arg))

    return Matcher(matches, name.encode())


def command_lines() -> list[tuple[int, bytes]]:
    """(pid, raw NUL-separated command line) of every process that has one (not kernel
    threads or zombies). Reads /proc directly: the reconcile does this every minute, and
    psutil.process_iter costs several times more."""
    table = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{entry}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            raw = os.read(fd, 1 << 16)
        except OSError:
            continue
        finally:
            os.close(fd)
        if raw:
            table.append((int(entry), raw))
    return table


def scan(matches: Matcher, exclude: set[int] | None = None,
         table: list[tuple[int, bytes]] | None = None) -> list[ProcInfo]:
    """Live processes whose command line matches, oldest first (from `table` when given).

    Processes whose parent also matches are left out: they are a program's own workers.
    """
    exclude = (exclude or set()) | {os.getpid()}
    hits = []
    for pid, raw in command_lines() if table is None else table:
        if pid in exclude or matches.needle not in raw:
            continue
        if matches(pid, split_cmdline(raw)):
            info = identify(pid)
            if info is not None:
                hits.append(info)
    pids = {h.pid for h in hits}
    return sorted((h for h in hits if h.ppid not in pids), key=lambda h: h.start_ticks)


def signal_program(pid: int, pgid: int, sig: int) -> None:
    """Signal a program's whole process group when it leads one, else the process alone."""
    try:
        if pgid == pid:
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group_leftovers(pgid: int) -> None:
    """SIGKILL whatever is left in a program's group after its leader exited."""
    if pgid <= 1 or pgid == os.getpgid(0):
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def pidfd(pid: int) -> int | None:
    """A pidfd that turns readable when the process exits (Linux >= 5.3), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
