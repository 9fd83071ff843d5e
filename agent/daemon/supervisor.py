"""The supervision loop: `python -m agent run`.

The loop sleeps in one select() on (a) a pidfd per supervised process and adopted task,
readable the moment that process exits, whether it is our child or adopted, and (b) the signal
wakeup pipe (SIGCHLD, TERM, USR1). So an exit is handled within milliseconds, not at the next
tick. Timers (backoff starts, stop deadlines, the tick, the reconcile) bound the sleep; none of
them is ever left in the past, so the loop never spins.

Each tick (tick_s) writes the heartbeat and status.json, follows the standing pointer
(node_switch.py), runs the exec-snapshot recovery (recovery.py) and the miner's pack export
(pack.py) when due, and appends the RESULT line when due. Each reconcile (reconcile_s) checks
every process again from scratch, stops duplicates, adopts programs someone else started and
rotates logs. The observer (observer.py) probes each program in a worker thread of its own.

Writes that fail (a full disk, an unwritable run/) never stop supervision: they are reported
in the status's `storage` and the RESULT line, and whatever depends on a durable record (a
pointer switch, a task) waits until it can be recorded. Each step of the start and of a tick is
guarded on its own: one that fails (garbage in a reading or in the state) is logged and the
others still run, so the heartbeat, the status and the RESULT line keep coming.

Every timer and every freshness limit runs on the monotonic clock; wall-clock times are only
recorded and shown. NVML runs in threads of its own (nvmlcheck.py): a hung driver call delays
nothing, and until NVML answers GPU programs wait (none is started) while the node runs.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from agent import __version__
from agent.base import procs
from agent.base.config import Config
from agent.base.detach import become_subreaper
from agent.base.files import DigestCache, append_line, atomic_write, read_json, touch, write_json
from agent.base.gpu import Admission, check, not_yet
from agent.base.identity import matcher_for
from agent.base.journal import Journal
from agent.base.persist import AgentState
from agent.base.pointer import PENDING
from agent.base.ports import find_p2p
from agent.base.template import TemplateError, render_argv, render_env, render_text
from agent.contract import (
    IDLE_STATES,
    MINER,
    NODE,
    PROCESS_STATES,
    ProgramState,
    StatusFile,
)
from agent.daemon import status
from agent.daemon.backoff import Backoff
from agent.daemon.digests import DigestWorker
from agent.daemon.freshness import (
    admission_limit_s,
    fresh_readings,
    of_running,
    reading_limit_s,
)
from agent.daemon.health import restart_unhealthy
from agent.daemon.node_switch import POST_EXEC_POLL_S, SYNC_WATCH_S, NodeSwitch, Running
from agent.daemon.nvmlcheck import AdmissionChecks
from agent.daemon.observer import Observer
from agent.daemon.pack import PackExport
from agent.daemon.probes import Reading
from agent.daemon.program import Program
from agent.daemon.recovery import ExecRecovery
from agent.daemon.rotation import rotate_logs
from agent.daemon.storage import Storage
from agent.daemon.strays import STRAY_POLL_S, Strays
from agent.daemon.tasks import Task

NO_PIDFD_POLL_S = 0.5
NVML_START_WAIT_S = 5.0  # at the start, how long NVML's first answer is waited for


class Supervisor:
    def __init__(self, cfg: Config, journal: Journal) -> None:
        self.cfg = cfg
        self.layout = cfg.layout
        self.journal = journal
        raw = read_json(self.layout.state)
        self.state, self._dropped = AgentState.from_raw(raw)
        if raw is None and self.layout.state.exists():
            self._dropped = ["the whole file (unreadable, not JSON, or over 16 MiB)"]
        self.digests = DigestCache()
        self.hasher = DigestWorker(self.digests, self._digest_done)
        backoff = Backoff(cfg.backoff_base_s, cfg.backoff_cap_s, cfg.backoff_jitter)
        self.programs = {
            name: Program(p, self.layout, backoff, cfg.degraded_after, journal)
            for name, p in cfg.programs.items()
        }
        self.switch = NodeSwitch(self)
        self.recovery = ExecRecovery(self)
        self.pack = PackExport(self)
        self.strays = Strays(journal)
        self.tasks: dict[int, Task] = {}
        self.p2p = find_p2p(cfg.p2p_port)
        self.admission: Admission = not_yet(cfg.admitted_driver, cfg.qualified_gpus, cfg.gpu_vendor,
                                            cfg.admitted_rocm)
        self.nvml = AdmissionChecks(self._check_admission, self.admission)
        self._nvml_hung_told = False
        self.observer: Observer | None = None
        self.observer_restarts = 0
        self._hung_probes: set[str] = set()  # programs whose probe is stuck, told once
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        self._step_errors: dict[str, str] = {}  # a failing step's last error, told once
        self._current: StatusFile | None = None  # this tick's status, for the RESULT line
        self.ticks = 0
        self.mode: str | None = None  # None: supervising; "leave": exit, programs keep running;
        #                                "stop": stop every program, then exit
        self.storage = Storage(journal)  # writes that fail (a full disk), reported
        self._logs: list[Path] = []
        self.selector = selectors.DefaultSelector()
        self._wakeup_r = self._wakeup_w = -1
        now = time.monotonic()
        self.next_tick = now
        self.next_reconcile = now + cfg.reconcile_s
        self.next_result = now  # set from the recorded last line at the start (run)

    # ================================================================== lifecycle

    def run(self, ready: Callable[[str], None] | None = None) -> int:
        self.layout.ensure()
        self._write_agent_pid()
        subreaper = become_subreaper()
        self._install_signals()
        self.journal(f"agent {__version__} started pid {os.getpid()} root {self.layout.root}"
                     f"{'' if subreaper else ' (could not become child subreaper)'}")
        if self._dropped:
            self.journal(f"state: dropped what is not a sane value in run/state.json: "
                         f"{', '.join(self._dropped)}")
        clamped = self.state.clamp_future(time.time())
        if clamped:
            self.journal(f"clock: {', '.join(clamped)} lay in the future (a clock step); reset")
            self.save_state()
        self.next_result = time.monotonic() + self._result_left()
        self.nvml.request()
        self.nvml.wait(NVML_START_WAIT_S)  # a hung NVML holds up nothing but GPU programs
        self.admission = self._fresh_admission()
        self._log_admission(None, self.admission)
        if not self.p2p.mapped:
            self.journal(f"p2p: no mapping ({self.p2p.reason})")
        self._guard("resuming tasks", self._resume_tasks)
        self._guard("adoption", self._adopt_at_start)
        self._guard("pointer", lambda: self.switch.follow(self.cfg.stop_grace_s))
        self._start_observer()
        self._step(time.monotonic())
        self._tick()
        if ready:
            ready(f"ok agent started (pid {os.getpid()}, root {self.layout.root})")
        while True:
            try:
                if self._iterate():
                    break
            except Exception:
                self.journal("internal error (continuing):\n" + traceback.format_exc())
                time.sleep(1.0)
        return self._finish()

    def _iterate(self) -> bool:
        """One pass of the loop; True when the agent should exit."""
        now = time.monotonic()
        for key, _ in self.selector.select(max(0.0, self._next_wake(now) - now)):
            kind, obj = key.data
            if kind == "wakeup":
                try:
                    while os.read(self._wakeup_r, 512):
                        pass
                except BlockingIOError:
                    pass
            elif kind == "program":
                self._pidfd_fired(obj)
            elif kind == "task" and not obj.alive():
                self._exited(obj.pid, None)
        self._reap()
        self._poll_without_pidfd()
        now = time.monotonic()
        if self.hasher.done.is_set() or self.hasher.take_settled(now):
            # a digest known, or a file settled: follow the pointer now, not a tick later, and
            # the node's start waits no longer either (the step just below)
            self.hasher.done.clear()
            self._guard("node check", self._check_node)
            self._guard("pointer", self._follow_pointer)
        elif self.switch.checking(self.programs.get(NODE)):
            self._guard("node check", self._check_node)
        self._check_strays(now)
        self._check_tasks(now)
        self._step(now)
        if self.switch.awaiting_sync():
            self._watch_switch()
        if now >= self.next_reconcile:
            self.next_reconcile = now + self.cfg.reconcile_s
            self._reconcile()
        if now >= self.next_tick:
            self.next_tick = now + self.cfg.tick_s
            self._tick()
        return self.mode == "leave" or (self.mode == "stop" and self._all_stopped())

    def _guard(self, step: str, run: Callable[[], object]) -> None:
        """Run one step; a failure is logged (once while it stays the same) and never keeps
        the other steps from running."""
        try:
            run()
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            if self._step_errors.get(step) != text:
                self._step_errors[step] = text
                self.journal(f"{step}: failed (continuing without it): {text}\n"
                             + traceback.format_exc())
        else:
            self._step_errors.pop(step, None)

    def _resume_tasks(self) -> None:
        for task in (self.recovery.resume(), self.pack.resume()):
            if task is not None:
                self._track_task(task)

    def _finish(self) -> int:
        if self.observer:
            self.observer.stop()
        if self.mode == "stop":
            for prog in self.programs.values():
                prog.remove_pidfile()
            self.journal("agent stopped its programs and exits")
        else:
            self.journal("agent exits; programs keep running and will be adopted")
        self._write_status(final=True)
        self.storage.attempt("agent.pid", lambda: self.layout.agent_pid.unlink(missing_ok=True))
        return 0

    def _write_agent_pid(self) -> None:
        # run/agent.pid is the plain pid (what `kill $(cat run/agent.pid)` expects); the
        # heartbeat file carries the identity that guards against PID reuse
        me = procs.identify(os.getpid())
        record: dict[str, Any] = me.record() if me else {"pid": os.getpid()}
        record.update(started_at=self.started_at, version=__version__, tick_s=self.cfg.tick_s)
        self.storage.attempt("heartbeat", lambda: write_json(self.layout.heartbeat, record))
        pid_line = f"{os.getpid()}\n"
        self.storage.attempt("agent.pid", lambda: atomic_write(self.layout.agent_pid, pid_line))

    def _install_signals(self) -> None:
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._wakeup_r, self._wakeup_w = r, w
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self._request("leave"))
        signal.signal(signal.SIGINT, lambda *_: self._request("leave"))
        signal.signal(signal.SIGUSR1, lambda *_: self._request("stop"))
        signal.signal(signal.SIGUSR2, lambda *_: self._tick_now())  # `agent switch` pointed
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.selector.register(r, selectors.EVENT_READ, ("wakeup", None))

    def _digest_done(self) -> None:
        """Called by the digest worker's thread: wake the loop (its select) now."""
        if self._wakeup_w >= 0:
            try:
                os.write(self._wakeup_w, b"d")
            except OSError:
                pass  # the pipe is full: the loop is awake already

    def _tick_now(self) -> None:
        """Look at the pointer (and everything else a tick does) now, not at the next tick."""
        self.next_tick = time.monotonic()

    def _request(self, mode: str) -> None:
        if self.mode != "stop":  # a stop in progress is not downgraded to a leave
            self.mode = mode

    def _all_stopped(self) -> bool:
        busy = any(p.state in PROCESS_STATES for p in self.programs.values())
        return not busy and not self.strays and not self.tasks

    # ================================================================== writes that may fail

    def save_state(self) -> bool:
        return self.storage.attempt("run/state.json", lambda: self.state.save(self.layout.state))

    def storage_view(self) -> dict[str, Any]:
        return self.storage.view()

    # ================================================================== values and wants

    def values(self, name: str = "") -> dict[str, str | None]:
        mapped = self.p2p.mapped
        binary = self.state.node_binary
        return {
            "root": str(self.layout.root),
            "name": name,
            "node_bin": binary.path if binary else None,
            "p2p_port": str(self.cfg.p2p_port) if self.cfg.p2p_port else None,
            "p2p_public_ip": self.p2p.public_ip if mapped else None,
            "p2p_public_port": str(self.p2p.public_port) if mapped else None,
        }

    def program(self, name: str) -> Program | None:
        return self.programs.get(name)

    def wanted(self, prog: Program) -> bool:
        return self._desired(prog)[0]

    def _desired(self, prog: Program) -> tuple[bool, str | None]:
        if self.mode == "stop":
            return False, "agent stopping"
        if prog.cfg.needs_gpu and self.admission.pending:
            return False, (f"waiting for {self.admission.reader} to answer "
                           "(admission not checked yet)")
        if prog.cfg.needs_gpu and not self.admission.admitted:
            return False, f"admission refused: {self.admission.reason}"
        if prog.name == NODE and self.state.node_binary is None:
            return False, self.switch.no_binary_reason()
        return True, None

    def _may_stay(self, prog: Program) -> bool:
        """A GPU program that already runs stays while NVML has not answered yet: it waits
        for the verdict (the freshness limit makes a silent NVML a refusal)."""
        return prog.cfg.needs_gpu and self.admission.pending and self.mode is None

    def _block(self, prog: Program, reason: str) -> None:
        if prog.state != ProgramState.BLOCKED or prog.reason != reason:
            self.journal(f"{prog.name}: not started: {reason}")
        prog.state, prog.reason, prog.next_start = ProgramState.BLOCKED, reason, None

    # ================================================================== the state machine

    def _step(self, now: float) -> None:
        """Each program on its own guard: one that fails (garbage in what it is started from)
        neither holds the others back nor the reconcile and the tick after it."""
        for prog in self.programs.values():
            self._guard(f"{prog.name}: supervision", partial(self._step_one, prog, now))

    def _step_one(self, prog: Program, now: float) -> None:
        if prog.state == ProgramState.STOPPING:
            prog.enforce_deadline(now)
            return
        wanted, why = self._desired(prog)
        if not wanted:
            if prog.state == ProgramState.RUNNING:
                if not self._may_stay(prog):
                    prog.begin_stop(self.cfg.grace(prog.cfg), why or "not wanted")
            elif self.mode == "stop":
                prog.state, prog.reason, prog.next_start = ProgramState.STOPPED, why, None
            else:
                self._block(prog, why or "not wanted")
            return
        if prog.state in IDLE_STATES:
            self._start(prog)
        elif prog.state == ProgramState.BACKOFF and prog.next_start is not None:
            if now >= prog.next_start:
                self._start(prog)
        elif prog.state == ProgramState.RUNNING and prog.proc is not None:
            if prog.failures and now - prog.proc.started_mono >= self.cfg.stable_s:
                prog.mark_stable()

    def _start(self, prog: Program) -> None:
        binary = sha256 = None
        if prog.name == NODE:
            # never two nodes: adopt one someone started, wait until any other is gone
            if self._waiting_for_old_node(prog) or self._settle(prog):
                self._waiting_for_old_node(prog)
                return
            refusal = self.switch.spawn_refusal()
            if refusal is not None:
                self._block(prog, refusal)
                return
            assert self.state.node_binary is not None
            binary, sha256 = self.state.node_binary.path, self.state.node_binary.sha256
        values = self.values(prog.name)
        try:  # checked at load with sample values; a real value may still be too long
            argv = render_argv(prog.cfg.command, values)
            env = dict(os.environ)
            env.update(render_env(prog.cfg.env, values))
            cwd = render_text(prog.cfg.cwd, values) or str(self.layout.root)
            log = render_text(prog.cfg.log, values) or str(self.layout.logs / f"{prog.name}.log")
        except TemplateError as e:
            self._block(prog, f"cannot fill in its command: {e}")
            return
        if binary is None:  # the program file (the script, for an interpreter), for the status
            exe = procs.executable_arg(argv)
            if exe and "/" not in exe:
                binary = shutil.which(exe, path=env.get("PATH"))
            elif exe:
                binary = os.path.normpath(os.path.join(cwd, exe))
        if prog.spawn(argv, env, cwd, log, binary, sha256):
            self._watch(prog)
            if prog.name == NODE and prog.proc is not None:
                self.switch.verify_started(prog)
                self.switch.node_started(prog.proc.sha256, prog.proc.started_at)

    # ================================================================== exits

    def _watch(self, prog: Program) -> None:
        if prog.proc is not None and prog.proc.pidfd is not None:
            self.selector.register(prog.proc.pidfd, selectors.EVENT_READ, ("program", prog))

    def _unwatch(self, fd: int | None) -> None:
        if fd is not None:
            try:
                self.selector.unregister(fd)
            except (KeyError, ValueError):
                pass

    def _pidfd_fired(self, prog: Program) -> None:
        p = prog.proc
        if p is None:
            return
        if p.child is not None:
            try:
                pid, wstatus = os.waitpid(p.pid, os.WNOHANG)
            except ChildProcessError:
                return  # already reaped by _reap, which booked the exit
            if pid == p.pid:
                self._exited(pid, os.waitstatus_to_exitcode(wstatus))
        elif not procs.is_same(p.pid, p.start_ticks):
            self._exited(p.pid, None)

    def _poll_without_pidfd(self) -> None:
        """Where pidfds are missing (kernel < 5.3), adopted processes are polled instead."""
        for prog in self.programs.values():
            p = prog.proc
            if p is not None and p.pidfd is None and p.child is None:
                if not procs.is_same(p.pid, p.start_ticks):
                    self._exited(p.pid, None)
        for task in list(self.tasks.values()):
            if task.adopted and task.pidfd is None and not task.alive():
                self._exited(task.pid, None)

    def _reap(self) -> None:
        """Reap every exited child: our programs and tasks, and orphans reparented to us."""
        while True:
            try:
                pid, wstatus = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._exited(pid, os.waitstatus_to_exitcode(wstatus))

    def _exited(self, pid: int, code: int | None) -> None:
        for prog in self.programs.values():
            if prog.proc is not None and prog.proc.pid == pid:
                self._unwatch(prog.proc.pidfd)
                if prog.name == NODE:
                    self.switch.node_exited(prog.proc.sha256)
                outcome = prog.exited(code, self.cfg.stable_s)
                if outcome == "restart" and self._desired(prog)[0]:
                    self._start(prog)
                return
        task = self.tasks.pop(pid, None)
        if task is not None:
            self._unwatch(task.pidfd)
            task.finished(code)
            self.state.tasks.pop(task.kind, None)
            (self.recovery if task.kind == "recovery" else self.pack).done(task, code)
            self.save_state()
            return
        self.strays.forget(pid)  # else: an orphan we reaped as subreaper

    def _waiting_for_old_node(self, prog: Program) -> bool:
        """While a node is being stopped the next one waits, blocked, with the reason (no timer
        of its own: the strays' poll wakes the loop, so it never spins)."""
        old = self.strays.of(NODE)
        if old and prog.state != ProgramState.RUNNING:
            self._block(prog, old[0].stopping.waiting_reason())
        return bool(old)

    def _check_strays(self, now: float) -> None:
        for stray in self.strays.check(now):
            if stray.program == NODE:  # the old node of a switch (maybe one the last agent began)
                self.switch.node_exited(stray.sha256)

    def _check_tasks(self, now: float) -> None:
        for task in self.tasks.values():
            if self.mode == "stop":
                task.stop("the agent is stopping", self.journal)  # do not wait for tasks
            task.enforce_deadline(now, self.journal)

    def _next_wake(self, now: float) -> float:
        wake = [self.next_tick, self.next_reconcile]
        for prog in self.programs.values():
            if prog.state == ProgramState.BACKOFF and prog.next_start is not None:
                wake.append(prog.next_start)
            elif prog.state == ProgramState.STOPPING and prog.stopping is not None:
                wake.append(prog.stopping.deadline)
            elif prog.state == ProgramState.RUNNING and prog.proc is not None:
                if prog.failures:
                    wake.append(prog.proc.started_mono + self.cfg.stable_s)
                if prog.proc.pidfd is None:
                    wake.append(now + NO_PIDFD_POLL_S)
        return min(wake + self._other_wakes(now))

    def _other_wakes(self, now: float) -> list[float]:
        """When the tasks, the strays, the node's switch and the hasher next need a look."""
        wake: list[float] = []
        for task in self.tasks.values():
            wake.append(task.wake_at())
            if task.adopted and task.pidfd is None:
                wake.append(now + NO_PIDFD_POLL_S)
        if self.strays:
            wake.append(now + STRAY_POLL_S)
        if self.switch.awaiting_sync():
            wake.append(now + SYNC_WATCH_S)
        if self.switch.checking(self.programs.get(NODE)):
            wake.append(now + POST_EXEC_POLL_S)
        settles = self.hasher.settles_at()
        if settles is not None:
            wake.append(settles)
        return wake

    # ================================================================== tasks

    def start_task(self, kind: str, argv: list[str], log: Path, timeout_s: float,
                   **record: Any) -> Task | None:
        """Start a task, recorded before and after: the intent (its argv) first, so that an
        agent killed between the start and the pid's record still leaves a trace the next
        one finds the task by; nothing starts that could not be recorded."""
        self.state.tasks[kind] = {"pid": None, "argv": argv, "started_at": time.time(), **record}
        if not self.save_state():
            self.journal(f"{kind}: not started: cannot record it in run/state.json")
            self.state.tasks.pop(kind, None)
            return None
        env = dict(os.environ, FLEET_ROOT=str(self.layout.root))
        try:
            task = Task.start(kind, argv, env, str(self.layout.root), str(log), timeout_s)
        except OSError as e:
            self.journal(f"{kind}: cannot start {argv[0]}: {e.strerror or e}")
            self.state.tasks.pop(kind, None)
            self.save_state()
            return None
        self._track_task(task)
        self.state.tasks[kind] = task.record(**record)
        self.save_state()  # if this fails, the intent record still finds the task by its argv
        return task

    def _track_task(self, task: Task) -> None:
        self.tasks[task.pid] = task
        if task.pidfd is not None:
            self.selector.register(task.pidfd, selectors.EVENT_READ, ("task", task))

    # ================================================================== adoption

    def _find_instances(self, prog: Program, table: list[tuple[int, bytes]] | None = None
                        ) -> list[procs.ProcInfo]:
        """Live processes that are this program, not counting ours; oldest first."""
        matches = matcher_for(self.cfg, prog.name, self.values(prog.name))
        if matches is None:
            return []
        tracked = [p.proc for p in self.programs.values() if p.proc is not None]
        skip = self.strays.pids() | set(self.tasks) | {p.pid for p in tracked}
        # process groups we own: a program's or a task's workers are not instances
        groups = {p.pgid for p in tracked if p.pgid == p.pid} | set(self.tasks)
        groups |= {s.pgid for s in self.strays if s.pgid == s.pid}
        return [i for i in procs.scan(matches, skip, table) if i.pgid not in groups]

    def _adopt_at_start(self) -> None:
        for prog in self.programs.values():
            mine = procs.from_record(read_json(self.layout.pidfile(prog.name)))
            if not self._settle(prog, mine):
                prog.remove_pidfile()

    def _settle(self, prog: Program, mine: procs.ProcInfo | None = None,
                table: list[tuple[int, bytes]] | None = None) -> bool:
        """The one rule for a program's instances on the box (at the start, at each reconcile,
        before each node start): find them, choose the one to keep, stop the others, adopt the
        kept one. `mine`: the pidfile's, kept first. True when any instance was found."""
        found = self._find_instances(prog, table)
        if mine is not None and all(i.pid != mine.pid for i in found):
            found.append(mine)
        if not found:
            return False
        wanted, why = self._desired(prog)
        # a node appearing while none is known is exactly what to adopt and record
        unknown_node = prog.name == NODE and self.state.node_binary is None and self.mode is None
        keeper: procs.ProcInfo | None = None
        running: Running | None = None
        pending: list[procs.ProcInfo] = []
        if prog.state in PROCESS_STATES:
            others, reason = found, f"duplicate {prog.name}"
        elif not (wanted or unknown_node or self._may_stay(prog)):
            others, reason = found, f"{prog.name} must not run: {why}"
        elif prog.name == NODE:
            chosen, others, pending = self.switch.choose(found, mine)
            keeper, running = chosen if chosen is not None else (None, None)
            reason = "duplicate node" if keeper is not None else "not the node the pointer names"
        else:
            keeper = mine if mine is not None else max(found, key=lambda i: i.start_ticks)
            others, reason = [i for i in found if i.pid != keeper.pid], f"duplicate {prog.name}"
        for other in others:
            self._add_stray(prog, other, reason)
        if keeper is not None:
            self._adopt(prog, keeper, running)
        elif pending:  # the loop is woken when the digest is known, and settles again
            pids = ", ".join(str(i.pid) for i in pending)
            self._block(prog, f"waiting for the sha256 of what pid {pids} runs ({PENDING}); "
                              "neither adopted nor stopped, nothing started meanwhile")
        return True

    def _adopt(self, prog: Program, info: procs.ProcInfo, running: Running | None) -> None:
        if running is None:  # not the node: its digest is shown, never decided on
            running = self.switch.digest_of(info)
        binary, sha256 = running.path, running.sha256
        prog.adopt(info, binary, sha256)
        if prog.name == NODE and prog.proc is not None:
            prog.proc.runs = procs.running_identity(info)
        self._watch(prog)
        if prog.name == NODE and prog.proc is not None:
            self.switch.adopted(binary, sha256)
            self.switch.node_started(sha256, prog.proc.started_at)

    def _add_stray(self, prog: Program, info: procs.ProcInfo, why: str) -> None:
        # about to be stopped: never hashed for it, only a digest known already is kept
        sha256 = self.switch.digest_of(info, hash_it=False).sha256 if prog.name == NODE else None
        self.strays.add(prog.name, info, self.cfg.grace(prog.cfg), why, sha256)

    def _reconcile(self) -> None:
        """From scratch: are our processes alive, are there others, is the p2p mapping the same."""
        for prog in self.programs.values():
            p = prog.proc
            if p is not None and not procs.is_same(p.pid, p.start_ticks):
                if p.child is not None:
                    self._reap()
                if prog.proc is p:  # not caught by events: book it now
                    self._exited(p.pid, None)
        self._guard("node check", self._check_node)
        table = procs.command_lines()  # one pass over /proc for every program
        for prog in self.programs.values():
            if prog.state != ProgramState.STOPPING:
                self._settle(prog, table=table)
        self._check_nvml()
        rotate_logs(self._log_paths(), self.cfg.log_max_bytes, self.cfg.log_keep, self.journal)
        p2p = find_p2p(self.cfg.p2p_port)
        if p2p != self.p2p:
            self.journal(f"p2p: mapping changed to {p2p.as_dict()} (used at the node's next start)")
            self.p2p = p2p

    # ================================================================== the tick

    def _tick(self) -> None:
        """Each step on its own guard: one failing never silences the heartbeat, the status
        or the RESULT line."""
        self.ticks += 1
        self._guard("observer", self._keep_observer)
        self._guard("admission", self._take_admission)
        self._guard("pointer", self._follow_pointer)
        self._guard("health", lambda: restart_unhealthy(self.cfg, self.programs.values(),
                                                        self.readings()))
        self._guard("switch timeline", self._watch_switch)
        self._guard("recovery", lambda: self.recovery.maybe_start(self.readings().get(NODE)))
        self._guard("pack hold", self.pack.hold)
        self._guard("pack export", lambda: self.pack.maybe_export(self.readings().get(NODE),
                                                           self.readings().get(MINER)))
        self.storage.attempt("heartbeat", lambda: touch(self.layout.heartbeat))
        self._current = None
        self._guard("status", self._write_status)
        self._guard("RESULT line", self._maybe_result)

    def _check_node(self) -> None:
        node = self.programs.get(NODE)
        if node is not None:
            self.switch.check_running(node)

    def _follow_pointer(self) -> None:
        node = self.programs.get(NODE)
        self.switch.follow(self.cfg.grace(node.cfg) if node else self.cfg.stop_grace_s)

    def _take_admission(self) -> None:
        admission = self._fresh_admission()
        if admission is not self.admission:
            previous, self.admission = self.admission, admission
            self._log_admission(previous, admission)

    def _result_left(self) -> float:
        """Seconds until the next RESULT line, from the last one's recorded time (at most one
        interval: a time recorded before a clock step back never holds it back longer)."""
        last, every = self.state.last_result_at, self.cfg.result_every_s
        return 0.0 if last is None else min(max(last + every - time.time(), 0.0), every)

    def _maybe_result(self) -> None:
        """The RESULT line goes to out/, independently of whether status.json could be
        written; it is timed on the monotonic clock."""
        now = time.monotonic()
        if now < self.next_result or not self._figures_ready(now):
            return
        current = self._current if self._current is not None else status.build(self)
        line = status.result_line(current)
        log = self.layout.standing_log
        if self.storage.attempt("out/standing.log", lambda: append_line(log, line)):
            self.next_result = now + self.cfg.result_every_s
            self.state.last_result_at = time.time()
            self.save_state()

    def _figures_ready(self, now: float) -> bool:
        """Whether a RESULT line would carry the node's figures: its RPC has answered, or it
        has none, or the agent has waited long enough (a silent node is a result too)."""
        node = self.cfg.programs.get(NODE)
        if node is None or not node.status_url:
            return True
        reading = self.readings().get(NODE)
        waited = now - self.started_mono >= min(self.cfg.result_every_s, 4 * self.cfg.tick_s)
        return (reading is not None and reading.data is not None) or waited

    def _write_status(self, final: bool = False) -> StatusFile:
        current = self._current = status.build(self, final)
        if not self.storage.attempt("run/status.json",
                                    lambda: write_json(self.layout.status, current)):
            return current
        if current["storage"]["failing"] != self.storage.view()["failing"]:
            # this very write cleared the failure the status still reports: say so now,
            # not a tick later
            current = self._current = status.build(self, final)
            self.storage.attempt("run/status.json",
                                 lambda: write_json(self.layout.status, current))
        return current

    # ================================================================== the observer

    def _start_observer(self) -> None:
        old = self.observer
        self.observer = Observer(self.cfg, self.values, old.readings if old else None,
                                 self._probe_interval)
        self.observer.start()

    def _keep_observer(self) -> None:
        """A probe worker whose thread ended is started again. One stuck where no probe
        deadline reaches is told, never replaced (its reading turns unknown by freshness, the
        other probes go on): the threads stay bounded at one per program."""
        obs = self.observer
        if obs is None or self.mode is not None:
            return
        for name, why in obs.revive(self.values):
            self.observer_restarts += 1
            self.journal(f"observer: the probe thread of {name} ended ({why}); restarting it "
                         f"(restart {self.observer_restarts})")
        hung = obs.hung(reading_limit_s(self.cfg))
        for name in sorted(hung.keys() - self._hung_probes):
            self.journal(f"observer: the probe of {name} has not returned for {hung[name]:.0f} s "
                         "(hung?); its reading is unknown, the other probes go on")
        for name in sorted(self._hung_probes - hung.keys()):
            self.journal(f"observer: the probe of {name} returned")
        self._hung_probes = set(hung)

    def _fresh_admission(self) -> Admission:
        """NVML's latest verdict, or a refusal when it is too old to trust (NVML hung): a
        guard that cannot tell says no. Its age is on the monotonic clock."""
        adm = self.nvml.verdict
        age = time.monotonic() - adm.checked_mono
        if age <= admission_limit_s(self.cfg) or not (adm.admitted or adm.pending):
            return adm
        if not self.admission.admitted and self.admission.reason.startswith("admission not"):
            return self.admission  # already refused for staleness: keep the same object
        return Admission(False, f"admission not checked for {age:.0f} s ({adm.reader} hung?)",
                         adm.driver, adm.wanted_driver, adm.uuids, adm.qualified_gpus,
                         adm.checked_at, adm.checked_mono, vendor=adm.vendor, rocm=adm.rocm,
                         wanted_rocm=adm.wanted_rocm)

    def _check_nvml(self) -> None:
        """Each reconcile: a new NVML check, unless the last one has not answered yet."""
        if self.nvml.request():
            self._nvml_hung_told = False
        elif not self._nvml_hung_told:
            self._nvml_hung_told = True
            self.journal(f"admission: the {self.admission.reader} check started "
                         f"{self.nvml.in_flight_s():.0f} s "
                         "ago has not answered (hung?); GPU programs stop once the verdict is "
                         f"{admission_limit_s(self.cfg):.0f} s old")

    def _probe_interval(self) -> float:
        return SYNC_WATCH_S if self.switch.awaiting_sync() else self.cfg.tick_s

    def _watch_switch(self) -> None:
        """Give the switch's timeline the node's latest reading (when it first says synced)."""
        reading, node = self.readings().get(NODE), self.programs.get(NODE)
        if self.observer and (reading is None or time.monotonic() - reading.mono > SYNC_WATCH_S):
            self.observer.poke()  # it may be sleeping a whole tick
        if reading and reading.data and node and node.proc:
            self.switch.node_reading(reading.data.get("synced") is True, reading.at,
                                     node.proc.sha256)

    def readings(self) -> dict[str, Reading]:
        """The observer's readings, each one past the freshness limit, or of a program that
        is not running now, made unknown."""
        if self.observer is None:
            return {}
        started = {name: p.proc.started_mono if p.state == ProgramState.RUNNING and p.proc else None
                   for name, p in self.programs.items()}
        max_age = {name: p.cfg.health_max_age_s for name, p in self.programs.items()}
        return of_running(fresh_readings(self.observer.readings, reading_limit_s(self.cfg)),
                          started, max_age)

    def observer_view(self) -> dict[str, Any]:
        obs = self.observer
        return {"alive": bool(obs and obs.is_alive()), "restarts": self.observer_restarts,
                "last_error": obs.last_error if obs else None,
                "round_at": obs.round_at if obs else None, "hung": sorted(self._hung_probes)}

    def digests_view(self) -> dict[str, Any]:
        busy = self.hasher.hashing()
        return {"hashing": busy[0] if busy else None,
                "for_s": round(busy[1], 1) if busy else None,
                "restarts": self.hasher.restarts, "last_error": self.hasher.last_error}

    def pointer_view(self) -> dict[str, Any]:
        return dict(self.switch.view)

    def recovery_view(self, now: float) -> dict[str, Any]:
        return self.recovery.view(now)

    def pack_view(self) -> dict[str, Any]:
        return self.pack.view()

    def _check_admission(self) -> Admission:
        cfg = self.cfg
        return check(cfg.gpu_vendor, cfg.admitted_driver, cfg.admitted_rocm, cfg.qualified_gpus)

    def _log_admission(self, before: Admission | None, after: Admission) -> None:
        if before is not None and (before.admitted, before.reason) == (
            after.admitted, after.reason
        ):
            return
        verdict = "admitted" if after.admitted else "pending" if after.pending else "REFUSED"
        self.journal(f"admission: {verdict}: {after.reason}")

    def _log_paths(self) -> list[Path]:
        if not self._logs:
            self._logs = [self.layout.agent_log, self.layout.recovery_log, self.layout.pack_log,
                          self.layout.standing_log]
            for name, p in self.cfg.programs.items():
                text = render_text(p.log, self.values(name))
                if text:
                    self._logs.append(Path(text))
        return self._logs
