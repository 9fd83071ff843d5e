"""One supervised program: its process, its state and its crash-loop bookkeeping.

States: running; backoff (crashed after a short run, waiting to start again); stopping (TERM
sent to its process group, KILL at the deadline); blocked (a guard forbids it: admission, no
node binary); stopped (not running and not held back: between an exit and the restart, or the
agent is shutting down). They are `agent.contract.ProgramState`. The supervisor decides *when*;
this class knows *how* (spawn, adopt, signal) and keeps the counts the status reports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.base import procs
from agent.base.config import ProgramConfig
from agent.base.files import write_json
from agent.base.stopping import Stopping
from agent.contract import Layout, ProgramState
from agent.daemon.backoff import Backoff


@dataclass
class Process:
    pid: int
    start_ticks: int  # identity with the pid (see procs): survives wall-clock steps
    pgid: int
    argv: list[str]
    started_mono: float  # monotonic clock at start (estimated for adopted processes)
    started_at: float  # wall clock at start
    adopted: bool
    child: subprocess.Popen[bytes] | None = None  # None when adopted: not our child
    pidfd: int | None = None
    binary: str | None = None
    sha256: str | None = None
    # the node only (node_switch.check_running): what it runs as last verified, None until then
    runs: tuple[object, ...] | None = None
    verify_until: float | None = None  # monotonic: how long an empty command line is waited out
    pending_since: float | None = None  # monotonic: since when its new digest is being hashed


class Program:
    def __init__(self, cfg: ProgramConfig, layout: Layout, backoff: Backoff,
                 degraded_after: int, journal: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.layout = layout
        self.backoff = backoff
        self.degraded_after = degraded_after
        self.journal = journal
        self.state: ProgramState = ProgramState.STOPPED
        self.proc: Process | None = None
        self.failures = 0  # consecutive runs shorter than stable_s
        self.degraded = False
        self.starts = 0
        self.next_start: float | None = None  # monotonic, while in backoff
        self.stopping: Stopping | None = None  # while state is "stopping"
        self.start_after_stop = False
        self.reason: str | None = None
        self._stop_why = ""
        self._stop_as_crash = False
        self.last_exit: dict[str, Any] | None = None
        self.unhealthy_since: float | None = None

    # ------------------------------------------------------------------ starting

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, log: str,
              binary: str | None = None, sha256: str | None = None) -> bool:
        """Start the program in its own session (so it is its own process group).
        False when the exec itself failed; that counts as a crash."""
        now_mono, now = time.monotonic(), time.time()
        self.starts += 1
        try:
            out = _open_log(log, self.journal, self.name)
            try:
                child = subprocess.Popen(
                    argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                )
            finally:
                os.close(out)
        except (OSError, ValueError, subprocess.SubprocessError) as e:  # ValueError: a NUL
            detail = getattr(e, "strerror", None) or str(e)
            self.journal(f"{self.name}: cannot start {argv[0] if argv else '?'}: {detail}")
            self.proc = None
            self.last_exit = {"code": None, "at": now, "run_s": 0.0, "error": detail}
            self._short_run(now_mono)
            return False
        # a child is never reaped behind our back, so its stat is there until we wait on it
        ticks = procs.start_ticks_of(child.pid) or 0
        self.proc = Process(child.pid, ticks, child.pid, list(argv), now_mono, now,
                            adopted=False, child=child, pidfd=procs.pidfd(child.pid),
                            binary=binary, sha256=sha256)
        self.state, self.reason, self.next_start = ProgramState.RUNNING, None, None
        self.unhealthy_since = None
        self.write_pidfile()
        self.journal(f"{self.name}: started pid {child.pid}: {' '.join(argv)}")
        return True

    def adopt(self, info: procs.ProcInfo, binary: str | None, sha256: str | None) -> None:
        age = info.age_s  # from boot-relative ticks: right even after a wall-clock step
        self.proc = Process(info.pid, info.start_ticks, info.pgid, list(info.argv),
                            time.monotonic() - age, time.time() - age, adopted=True,
                            child=None, pidfd=procs.pidfd(info.pid), binary=binary,
                            sha256=sha256)
        self.state, self.reason, self.next_start = ProgramState.RUNNING, None, None
        self.write_pidfile()
        self.journal(f"{self.name}: adopted pid {info.pid} (running {age:.0f} s): "
                     f"{' '.join(info.argv)}")

    def pidfile_record(self) -> dict[str, Any]:
        p = self.proc
        assert p is not None
        return {"pid": p.pid, "start_ticks": p.start_ticks, "boot_id": procs.boot_id(),
                "pgid": p.pgid, "argv": p.argv, "started_at": p.started_at,
                "binary": p.binary, "sha256": p.sha256}

    def write_pidfile(self) -> None:
        try:
            write_json(self.layout.pidfile(self.name), self.pidfile_record())
        except OSError as e:  # a full disk must not stop supervision; the scan still finds it
            self.journal(f"{self.name}: cannot write its pidfile: {e.strerror or e}")

    def remove_pidfile(self) -> None:
        try:
            self.layout.pidfile(self.name).unlink(missing_ok=True)
        except OSError as e:
            self.journal(f"{self.name}: cannot remove its pidfile: {e.strerror or e}")

    # ------------------------------------------------------------------ stopping

    def begin_stop(self, grace_s: float, why: str, start_after: bool = False,
                   as_crash: bool = False) -> None:
        """TERM the process group now; `enforce_deadline` escalates when the grace runs out.
        `as_crash`: the exit counts as a short run (backoff), for a start that went wrong."""
        p = self.proc
        if p is None or self.state != ProgramState.RUNNING:
            return
        self.state = ProgramState.STOPPING
        self.start_after_stop = start_after
        self.stopping = Stopping(self.name, p.pid, p.pgid, grace_s, why, self.journal)
        self._stop_why, self._stop_as_crash = why, as_crash
        self._stop_reason()

    def enforce_deadline(self, now: float) -> None:
        if self.state == ProgramState.STOPPING and self.stopping is not None:
            self.stopping.enforce(now)
            self._stop_reason()

    def _stop_reason(self) -> None:
        """While stopping, the status says why and what it waits for (a process that survives
        SIGKILL is named with the count, refreshed at each escalation)."""
        if self.stopping is not None:
            self.reason = f"{self._stop_why}: {self.stopping.waiting_reason()}"

    # ------------------------------------------------------------------ exits

    def exited(self, code: int | None, stable_s: float) -> str:
        """Book an exit of the current process. Returns what should happen next:
        "restart" (at once), "backoff" (at next_start) or "stopped" (after a stop)."""
        p = self.proc
        assert p is not None
        now_mono, now = time.monotonic(), time.time()
        run_s = now_mono - p.started_mono
        if p.child is not None:
            p.child.returncode = code  # reaped by us: keep Popen from waiting on the pid again
        if p.pidfd is not None:
            os.close(p.pidfd)
        procs.kill_group_leftovers(p.pgid if p.pgid == p.pid else -1)
        self.remove_pidfile()
        self.proc = None
        self.stopping = None
        self.last_exit = {"code": code, "at": now, "run_s": round(run_s, 3)}
        if self.state == ProgramState.STOPPING:
            self.state, self.reason = ProgramState.STOPPED, None
            self.journal(f"{self.name}: pid {p.pid} stopped ({describe(code)})")
            if self._stop_as_crash:  # never a quick loop of starts that each go wrong
                self._short_run(now_mono)
                return "backoff"
            return "stopped"
        if run_s >= stable_s:
            self.state = ProgramState.STOPPED  # not running; the supervisor starts it at once
            self.failures = 0
            self.degraded = False
            self.journal(f"{self.name}: pid {p.pid} exited ({describe(code)}) after "
                         f"{run_s:.1f} s; restarting")
            return "restart"
        self.journal(f"{self.name}: pid {p.pid} exited ({describe(code)}) after {run_s:.1f} s")
        self._short_run(now_mono)
        return "backoff"

    def _short_run(self, now_mono: float) -> None:
        self.failures += 1
        delay = self.backoff.delay(self.failures)
        self.state = ProgramState.BACKOFF
        self.next_start = now_mono + delay
        self.reason = f"crash loop: {self.failures} short run(s) in a row"
        if self.failures >= self.degraded_after and not self.degraded:
            self.degraded = True
            self.journal(f"{self.name}: degraded after {self.failures} short runs; "
                         "still retrying")
        self.journal(f"{self.name}: next start in {delay:.2f} s")

    def mark_stable(self) -> None:
        if self.failures or self.degraded:
            self.journal(f"{self.name}: stable again after {self.failures} short run(s)")
        self.failures = 0
        self.degraded = False


def _open_log(log: str, journal: Callable[[str], None], name: str) -> int:
    """The program's log opened for appending; /dev/null when it cannot be (a full or read-only
    disk must not keep a program from running: losing its output is the lesser harm)."""
    try:
        os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
        return os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except OSError as e:
        journal(f"{name}: cannot open its log {log}: {e.strerror or e}; output discarded")
        return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)


def describe(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"
