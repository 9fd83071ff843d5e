"""The supervision loop: `python -m agent run`.

The loop sleeps in one select() on (a) a pidfd per supervised process, readable the moment
that process exits, whether it is our child or adopted, and (b) the signal wakeup pipe
(SIGCHLD, TERM, USR1). So an exit is handled within milliseconds, not at the next tick.
Timers (backoff starts, stop deadlines, the tick, the reconcile) bound the sleep.

Each tick (tick_s) writes the heartbeat and status.json, follows the standing pointer, runs
the exec-snapshot recovery and the miner's pack export when due, rotates logs and appends the
RESULT line when due. Each reconcile (reconcile_s) checks every process again from scratch,
stops duplicates, adopts programs someone else started and re-checks admission.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import __version__, procs, status
from agent.backoff import Backoff
from agent.config import Config
from agent.daemon import become_subreaper
from agent.files import DigestCache, append_line, atomic_write, read_json, touch, write_json
from agent.gpu import Admission, admit, read_gpu
from agent.identity import matcher_for
from agent.journal import Journal
from agent.persist import AgentState, NodeBinary
from agent.pointer import check_pointer, pointer_signature, read_pointer
from agent.ports import find_p2p
from agent.probes import Observer, Reading
from agent.program import Program
from agent.rotation import rotate_if_big
from agent.tasks import Task
from agent.template import render_argv, render_env, render_text

NODE = "node"
MINER = "miner"
STRAY_POLL_S = 0.2
NO_PIDFD_POLL_S = 0.5


@dataclass
class Stray:
    """A duplicate of a program being stopped (TERM, then KILL after the grace)."""

    program: str
    pid: int
    pgid: int
    create_time: float
    deadline: float
    killed: bool = False


class Supervisor:
    def __init__(self, cfg: Config, journal: Journal) -> None:
        self.cfg = cfg
        self.layout = cfg.layout
        self.journal = journal
        self.state = AgentState.load(self.layout.state)
        self.digests = DigestCache()
        backoff = Backoff(cfg.backoff_base_s, cfg.backoff_cap_s, cfg.backoff_jitter)
        self.programs = {
            name: Program(p, self.layout, backoff, cfg.degraded_after, journal)
            for name, p in cfg.programs.items()
        }
        self.strays: dict[int, Stray] = {}
        self.tasks: dict[int, Task] = {}
        self.recovery_task: Task | None = None
        self.pack_task: Task | None = None
        self.pack_task_seed: str | None = None
        self.pack_error: dict[str, Any] | None = None
        self.pointer_view: dict[str, Any] = {"state": "absent"}
        self.p2p = find_p2p(cfg.p2p_port)
        self.admission: Admission = admit(read_gpu(), cfg.admitted_driver, cfg.qualified_gpus)
        self.observer: Observer | None = None
        self.started_at = time.time()
        self.ticks = 0
        self.mode: str | None = None  # None: supervising; "leave": exit, programs keep running;
        #                                "stop": stop every program, then exit
        self._logs: list[Path] | None = None
        self._pointer_seen: object = None
        self.selector = selectors.DefaultSelector()
        self._wakeup_r = -1
        now = time.monotonic()
        self.next_tick = now
        self.next_reconcile = now + cfg.reconcile_s

    # ================================================================== lifecycle

    def run(self, ready: Callable[[str], None] | None = None) -> int:
        self.layout.ensure()
        self._write_agent_pid()
        subreaper = become_subreaper()
        self._install_signals()
        self.journal(f"agent {__version__} started pid {os.getpid()} root {self.layout.root}"
                     f"{'' if subreaper else ' (could not become child subreaper)'}")
        self._log_admission(None, self.admission)
        if not self.p2p.mapped:
            self.journal(f"p2p: no mapping ({self.p2p.reason})")
        self._resume_recovery_record()
        self._adopt_at_start()
        self._follow_pointer()
        self.observer = Observer(self.cfg, self.values, self._check_admission, self.admission)
        self.observer.start()
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
        self._reap()
        self._poll_without_pidfd()
        now = time.monotonic()
        self._check_strays(now)
        self._check_tasks(now)
        self._step(now)
        if now >= self.next_reconcile:
            self.next_reconcile = now + self.cfg.reconcile_s
            self._reconcile()
        if now >= self.next_tick:
            self.next_tick = now + self.cfg.tick_s
            self._tick()
        return self.mode == "leave" or (self.mode == "stop" and self._all_stopped())

    def _finish(self) -> int:
        if self.observer:
            self.observer.stop()
        if self.mode == "stop":
            for name in self.programs:
                self.layout.pidfile(name).unlink(missing_ok=True)
            self.journal("agent stopped its programs and exits")
        else:
            self.journal("agent exits; programs keep running and will be adopted")
        self._write_status(final=True)
        self.layout.agent_pid.unlink(missing_ok=True)
        return 0

    def _write_agent_pid(self) -> None:
        # run/agent.pid is the plain pid (what `kill $(cat run/agent.pid)` expects); the
        # heartbeat file carries the identity that guards against PID reuse
        write_json(self.layout.heartbeat, {
            "pid": os.getpid(), "create_time": procs.create_time_of(os.getpid()),
            "started_at": self.started_at, "version": __version__, "tick_s": self.cfg.tick_s,
        })
        atomic_write(self.layout.agent_pid, f"{os.getpid()}\n")

    def _install_signals(self) -> None:
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._wakeup_r = r
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self._request("leave"))
        signal.signal(signal.SIGINT, lambda *_: self._request("leave"))
        signal.signal(signal.SIGUSR1, lambda *_: self._request("stop"))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.selector.register(r, selectors.EVENT_READ, ("wakeup", None))

    def _request(self, mode: str) -> None:
        if self.mode != "stop":  # a stop in progress is not downgraded to a leave
            self.mode = mode

    def _all_stopped(self) -> bool:
        busy = any(p.state in ("running", "stopping") for p in self.programs.values())
        return not busy and not self.strays and not self.tasks

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

    def _desired(self, prog: Program) -> tuple[bool, str | None]:
        if self.mode == "stop":
            return False, "agent stopping"
        if prog.cfg.needs_gpu and not self.admission.admitted:
            return False, f"admission refused: {self.admission.reason}"
        if prog.name == NODE and self.state.node_binary is None:
            return False, "no node binary: standing.node is absent and no node runs"
        return True, None

    # ================================================================== the state machine

    def _step(self, now: float) -> None:
        for prog in self.programs.values():
            if prog.state == "stopping":
                prog.enforce_deadline(now)
                continue
            wanted, why = self._desired(prog)
            if not wanted:
                if prog.state == "running":
                    prog.begin_stop(self.cfg.grace(prog.cfg), why or "not wanted")
                else:
                    if prog.state != "blocked" and self.mode != "stop":
                        self.journal(f"{prog.name}: not started: {why}")
                    prog.state = "stopped" if self.mode == "stop" else "blocked"
                    prog.reason, prog.next_start = why, None
                continue
            if prog.state in ("blocked", "stopped"):
                self._start(prog)
            elif prog.state == "backoff" and prog.next_start is not None:
                if now >= prog.next_start:
                    self._start(prog)
            elif prog.state == "running" and prog.proc is not None:
                if prog.failures and now - prog.proc.started_mono >= self.cfg.stable_s:
                    prog.mark_stable()

    def _start(self, prog: Program) -> None:
        binary = sha256 = None
        if prog.name == NODE:
            if any(s.program == NODE for s in self.strays.values()):
                return  # never two nodes: wait until the old one is gone
            running = self._find_instances(prog)
            if running:  # someone started a node: adopt it rather than start a second one
                self._adopt(prog, running[-1])
                for other in running[:-1]:
                    self._add_stray(prog, other, "duplicate node")
                return
            assert self.state.node_binary is not None
            binary, sha256 = self.state.node_binary.path, self.state.node_binary.sha256
        values = self.values(prog.name)
        argv = render_argv(prog.cfg.command, values)
        env = dict(os.environ)
        env.update(render_env(prog.cfg.env, values))
        cwd = render_text(prog.cfg.cwd, values) or str(self.layout.root)
        log = render_text(prog.cfg.log, values) or str(self.layout.logs / f"{prog.name}.log")
        if binary is None:  # the program file (the script, for an interpreter), for the status
            exe = procs.executable_arg(argv)
            if exe and "/" not in exe:
                binary = shutil.which(exe, path=env.get("PATH"))
            elif exe:
                binary = os.path.normpath(os.path.join(cwd, exe))
        if prog.spawn(argv, env, cwd, log, binary, sha256):
            self._watch(prog)

    # ================================================================== exits

    def _watch(self, prog: Program) -> None:
        if prog.proc is not None and prog.proc.pidfd is not None:
            self.selector.register(prog.proc.pidfd, selectors.EVENT_READ, ("program", prog))

    def _unwatch(self, prog: Program) -> None:
        if prog.proc is not None and prog.proc.pidfd is not None:
            try:
                self.selector.unregister(prog.proc.pidfd)
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
        elif not procs.is_same(p.pid, p.create_time):
            self._exited(p.pid, None)

    def _poll_without_pidfd(self) -> None:
        """Where pidfds are missing (kernel < 5.3), adopted processes are polled instead."""
        for prog in self.programs.values():
            p = prog.proc
            if p is not None and p.pidfd is None and p.child is None:
                if not procs.is_same(p.pid, p.create_time):
                    self._exited(p.pid, None)

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
                self._unwatch(prog)
                outcome = prog.exited(code, self.cfg.stable_s)
                if outcome == "restart" and self._desired(prog)[0]:
                    self._start(prog)
                return
        task = self.tasks.pop(pid, None)
        if task is not None:
            task.finished(code)
            self._task_done(task, code)
            return
        self.strays.pop(pid, None)  # else: an orphan we reaped as subreaper

    def _check_strays(self, now: float) -> None:
        for pid, stray in list(self.strays.items()):
            if not procs.is_same(pid, stray.create_time):
                del self.strays[pid]
                procs.kill_group_leftovers(stray.pgid if stray.pgid == pid else -1)
            elif now >= stray.deadline and not stray.killed:
                procs.signal_program(pid, stray.pgid, signal.SIGKILL)
                stray.killed = True

    def _check_tasks(self, now: float) -> None:
        for task in self.tasks.values():
            if self.mode == "stop":
                task.deadline = min(task.deadline, now)  # stopping: do not wait for tasks
            task.enforce_deadline(now)

    def _next_wake(self, now: float) -> float:
        wake = [self.next_tick, self.next_reconcile]
        for prog in self.programs.values():
            if prog.state == "backoff" and prog.next_start is not None:
                wake.append(prog.next_start)
            elif prog.state == "stopping" and prog.stop_deadline is not None:
                wake.append(prog.stop_deadline)
            elif prog.state == "running" and prog.proc is not None:
                if prog.failures:
                    wake.append(prog.proc.started_mono + self.cfg.stable_s)
                if prog.proc.pidfd is None:
                    wake.append(now + NO_PIDFD_POLL_S)
        wake.extend(t.deadline for t in self.tasks.values())
        if self.strays:
            wake.append(now + STRAY_POLL_S)
        return min(wake)

    # ================================================================== adoption

    def _matcher(self, prog: Program) -> procs.Matcher | None:
        return matcher_for(self.cfg, prog.name, self.values(prog.name))

    def _find_instances(self, prog: Program, table: list[tuple[int, bytes]] | None = None
                        ) -> list[procs.ProcInfo]:
        """Live processes that are this program, not counting ours; oldest first."""
        matches = self._matcher(prog)
        if matches is None:
            return []
        tracked = [p.proc for p in self.programs.values() if p.proc is not None]
        skip = set(self.strays) | set(self.tasks) | {p.pid for p in tracked}
        # process groups we own: a program's or a task's workers are not instances
        groups = {p.pgid for p in tracked if p.pgid == p.pid} | set(self.tasks)
        groups |= {s.pgid for s in self.strays.values() if s.pgid == s.pid}
        return [i for i in procs.scan(matches, skip, table) if i.pgid not in groups]

    def _from_pidfile(self, prog: Program) -> procs.ProcInfo | None:
        record = read_json(self.layout.pidfile(prog.name))
        if not isinstance(record, dict):
            return None
        pid, create_time = record.get("pid"), record.get("create_time")
        if not isinstance(pid, int) or not isinstance(create_time, int | float):
            return None
        info = procs.identify(pid)
        if info is None or abs(info.create_time - create_time) > procs.CREATE_TIME_SLACK:
            return None  # gone, or the pid now names another process (PID reuse)
        return info

    def _adopt_at_start(self) -> None:
        for prog in self.programs.values():
            mine = self._from_pidfile(prog)
            found = self._find_instances(prog)
            if mine is not None and all(i.pid != mine.pid for i in found):
                found.append(mine)
            if not found:
                self.layout.pidfile(prog.name).unlink(missing_ok=True)
                continue
            keeper = self._keeper(prog, found, mine)
            self._adopt(prog, keeper)
            for other in found:
                if other.pid != keeper.pid:
                    self._add_stray(prog, other, f"duplicate {prog.name}")

    def _keeper(self, prog: Program, found: list[procs.ProcInfo],
                mine: procs.ProcInfo | None) -> procs.ProcInfo:
        newest = max(found, key=lambda i: i.create_time)
        if prog.name == NODE and read_pointer(self.layout) is None:
            return newest  # no pointer: a newer node someone started is never downgraded
        return mine if mine is not None else newest

    def _adopt(self, prog: Program, info: procs.ProcInfo) -> None:
        binary = procs.binary_of(info)
        sha256 = None
        if binary:
            try:
                sha256 = self.digests.sha256(Path(binary))
            except OSError:
                sha256 = None
        prog.adopt(info, binary, sha256)
        self._watch(prog)
        if prog.name == NODE and binary and sha256:
            pointer = read_pointer(self.layout)
            unchanged = pointer is None or pointer.key == self.state.pointer_applied
            current = self.state.node_binary
            if unchanged and (current is None or current.sha256 != sha256):
                self.state.node_binary = NodeBinary(binary, sha256, "adopted")
                self._save_state()
                self.journal(f"node: recorded running binary {binary} ({sha256[:16]})")

    def _add_stray(self, prog: Program, info: procs.ProcInfo, why: str) -> None:
        if info.pid in self.strays:
            return
        grace = self.cfg.grace(prog.cfg)
        self.strays[info.pid] = Stray(prog.name, info.pid, info.pgid, info.create_time,
                                      time.monotonic() + grace)
        self.journal(f"{prog.name}: stopping pid {info.pid} ({why}): {' '.join(info.argv)}")
        procs.signal_program(info.pid, info.pgid, signal.SIGTERM)

    def _reconcile(self) -> None:
        """From scratch: are our processes alive, are there others, is the p2p mapping the same."""
        for prog in self.programs.values():
            p = prog.proc
            if p is not None and not procs.is_same(p.pid, p.create_time):
                if p.child is not None:
                    self._reap()
                if prog.proc is p:  # not caught by events: book it now
                    self._exited(p.pid, None)
        table = procs.command_lines()  # one pass over /proc for every program
        for prog in self.programs.values():
            if prog.state == "stopping":
                continue
            others = self._find_instances(prog, table)
            if not others:
                continue
            # a node appearing while none is known is exactly what to adopt and record
            unknown_node = prog.name == NODE and self.state.node_binary is None
            wanted = self._desired(prog)[0] or (unknown_node and self.mode is None)
            if prog.state == "running" or not wanted:
                for info in others:
                    self._add_stray(prog, info, f"duplicate {prog.name}" if wanted
                                    else f"{prog.name} must not run: {prog.reason}")
            else:  # wanted but not running: someone started it; adopt instead of a second one
                self._adopt(prog, others[-1])
                for info in others[:-1]:
                    self._add_stray(prog, info, f"duplicate {prog.name}")
        self._rotate_logs()
        p2p = find_p2p(self.cfg.p2p_port)
        if p2p != self.p2p:
            self.journal(f"p2p: mapping changed to {p2p.as_dict()} (used at the node's next start)")
            self.p2p = p2p

    # ================================================================== the tick

    def _tick(self) -> None:
        self.ticks += 1
        if self.observer is not None and self.observer.admission is not self.admission:
            previous, self.admission = self.admission, self.observer.admission
            self._log_admission(previous, self.admission)
        self._follow_pointer()
        readings = self.observer.readings if self.observer else {}
        self._track_health(readings)
        self._maybe_recover(readings.get(NODE))
        self._maybe_export_pack(readings.get(NODE), readings.get(MINER))
        now = time.time()
        touch(self.layout.heartbeat)
        current = self._write_status()
        last = self.state.last_result_at
        if (last is None or now - last >= self.cfg.result_every_s) and self._figures_ready(now):
            append_line(self.layout.standing_log, status.result_line(current))
            self.state.last_result_at = now
            self._save_state()

    def _figures_ready(self, now: float) -> bool:
        """Whether a RESULT line would carry the node's figures: its RPC has answered, or it
        has none, or the agent has waited long enough (a silent node is a result too)."""
        node = self.cfg.programs.get(NODE)
        if node is None or not node.status_url:
            return True
        reading = self.observer.readings.get(NODE) if self.observer else None
        waited = now - self.started_at >= min(self.cfg.result_every_s, 4 * self.cfg.tick_s)
        return (reading is not None and reading.data is not None) or waited

    def _write_status(self, final: bool = False) -> dict[str, Any]:
        current = status.build(self, final)
        write_json(self.layout.status, current)
        return current

    def _check_admission(self) -> Admission:
        return admit(read_gpu(), self.cfg.admitted_driver, self.cfg.qualified_gpus)

    def _log_admission(self, before: Admission | None, after: Admission) -> None:
        if before is not None and (before.admitted, before.reason) == (
            after.admitted, after.reason
        ):
            return
        verdict = "admitted" if after.admitted else "REFUSED"
        self.journal(f"admission: {verdict}: {after.reason}")

    def _track_health(self, readings: dict[str, Reading]) -> None:
        now = time.monotonic()
        for prog in self.programs.values():
            reading = readings.get(prog.name)
            if prog.state != "running" or prog.proc is None or reading is None:
                prog.unhealthy_since = None
                continue
            if reading.healthy is not False:
                prog.unhealthy_since = None
                continue
            if prog.unhealthy_since is None:
                prog.unhealthy_since = now
            limit = prog.cfg.restart_unhealthy_after_s
            old_enough = now - prog.proc.started_mono >= max(self.cfg.stable_s, limit)
            if limit and old_enough and now - prog.unhealthy_since >= limit:
                prog.begin_stop(self.cfg.grace(prog.cfg), f"unhealthy: {reading.error}")

    def _rotate_logs(self) -> None:
        if self._logs is None:
            self._logs = [self.layout.agent_log, self.layout.recovery_log, self.layout.pack_log]
            for name, p in self.cfg.programs.items():
                text = render_text(p.log, self.values(name))
                if text:
                    self._logs.append(Path(text))
        for path in self._logs:
            try:
                if rotate_if_big(path, self.cfg.log_max_bytes, self.cfg.log_keep):
                    self.journal(f"rotated {path}")
            except OSError as e:
                self.journal(f"cannot rotate {path}: {e}")

    # ================================================================== the standing pointer

    def _follow_pointer(self) -> None:
        seen = pointer_signature(self.layout)
        if seen == self._pointer_seen and self.pointer_view.get("state") != "refused":
            return  # unchanged since the last look, which applied it or found it absent
        self._pointer_seen = seen
        pointer = read_pointer(self.layout)
        if pointer is None:
            self.pointer_view = {"state": "absent", "path": None, "reason": None}
            return
        if pointer.key == self.state.pointer_applied:
            self.pointer_view = {"state": "applied", "path": pointer.target, "reason": None}
            return
        verdict = check_pointer(pointer, self.digests)
        if not verdict.ok:
            if self.pointer_view.get("reason") != verdict.reason:
                self.journal(f"pointer refused: {verdict.reason}; the node keeps running")
            self.pointer_view = {"state": "refused", "path": pointer.target,
                                 "reason": verdict.reason}
            return
        assert verdict.sha256 is not None
        self.state.node_binary = NodeBinary(verdict.path, verdict.sha256, "pointer")
        self.state.pointer_applied = pointer.key
        self._save_state()
        self.pointer_view = {"state": "applied", "path": pointer.target, "reason": None}
        self.journal(f"pointer: node binary is now {verdict.path} ({verdict.sha256[:16]})")
        node = self.programs.get(NODE)
        if node and node.state == "running" and node.proc and node.proc.sha256 != verdict.sha256:
            node.begin_stop(self.cfg.grace(node.cfg), f"switching to {verdict.sha256[:16]}")

    # ================================================================== recovery and pack

    def _resume_recovery_record(self) -> None:
        rec = self.state.recovery
        if rec.get("state") == "running":  # the previous agent died while the recipe ran
            rec.update(state="idle", outcome="interrupted", finished_at=time.time())
            self._save_state()

    def _maybe_recover(self, node: Reading | None) -> None:
        rc = self.cfg.recovery
        if not rc.recipe or self.recovery_task is not None or node is None or not node.data:
            return
        data = node.data
        stuck = (data.get("synced") is True and _int(data.get("blocks")) > rc.min_blocks
                 and _int(data.get("exec_tip"), -1) == 0)
        if not stuck:
            return
        finished = self.state.recovery.get("finished_at")
        if isinstance(finished, int | float) and time.time() < finished + rc.cooldown_s:
            return
        argv = render_argv(rc.recipe, self.values())
        self.recovery_task = self._run_task("recovery", argv, self.layout.recovery_log,
                                            rc.timeout_s)
        if self.recovery_task is None:
            return
        runs = _int(self.state.recovery.get("runs"), 0) + 1
        self.state.recovery = {"state": "running", "runs": runs,
                               "started_at": self.recovery_task.started_at,
                               "blocks": data.get("blocks"), "argv": argv}
        self._save_state()
        self.journal(f"recovery: node synced at {data.get('blocks')} blocks with exec tip 0; "
                     f"running {' '.join(argv)}")

    def _maybe_export_pack(self, node: Reading | None, miner: Reading | None) -> None:
        seed = node.data.get("seed") if node and node.data else None
        prog = self.programs.get(MINER)
        if not isinstance(seed, str) or not seed or seed == self.state.pack_seed:
            return
        if prog is None or self.pack_task is not None or not self._desired(prog)[0]:
            return
        if self.state.pack_seed is None and miner and miner.data and miner.data.get("seed") == seed:
            self.state.pack_seed = seed  # first sight: the miner already mines this seed
            self._save_state()
            return
        pc = self.cfg.miner_pack
        if not pc.command:
            return
        err = self.pack_error
        if err and err["seed"] == seed and time.monotonic() < err["mono"] + pc.retry_s:
            return
        argv = render_argv(pc.command, {**self.values(MINER), "seed": seed})
        self.pack_task = self._run_task("pack", argv, self.layout.pack_log, pc.timeout_s)
        if self.pack_task is not None:
            self.pack_task_seed = seed
            self.journal(f"pack: node seed is now {seed}; exporting: {' '.join(argv)}")

    def _run_task(self, kind: str, argv: list[str], log: Any, timeout_s: float) -> Task | None:
        env = dict(os.environ, FLEET_ROOT=str(self.layout.root))
        try:
            task = Task(kind, argv, env, str(self.layout.root), str(log), timeout_s)
        except OSError as e:
            self.journal(f"{kind}: cannot start {argv[0]}: {e.strerror or e}")
            if kind == "pack":
                self.pack_error = {"seed": None, "mono": time.monotonic(), "error": str(e)}
            return None
        self.tasks[task.pid] = task
        return task

    def _task_done(self, task: Task, code: int | None) -> None:
        outcome = "timeout" if task.timed_out else "ok" if code == 0 else "failed"
        took = time.time() - task.started_at
        if task is self.recovery_task:
            self.recovery_task = None
            self.state.recovery.update(state="idle", finished_at=time.time(), rc=code,
                                       outcome=outcome)
            self._save_state()
            self.journal(f"recovery: {outcome} (exit {code}) after {took:.1f} s; "
                         f"cooldown {self.cfg.recovery.cooldown_s:.0f} s")
        elif task is self.pack_task:
            seed, self.pack_task, self.pack_task_seed = self.pack_task_seed, None, None
            if outcome == "ok" and seed is not None:
                self.state.pack_seed = seed
                self.pack_error = None
                self._save_state()
                self.journal(f"pack: exported for seed {seed}; restarting the miner")
                miner = self.programs.get(MINER)
                if miner and miner.state == "running":
                    miner.begin_stop(self.cfg.grace(miner.cfg), f"new pack for seed {seed}")
            else:
                self.pack_error = {"seed": seed, "mono": time.monotonic(), "rc": code,
                                   "outcome": outcome, "at": time.time()}
                self.journal(f"pack: export {outcome} (exit {code}); retry in "
                             f"{self.cfg.miner_pack.retry_s:.0f} s")

    def _save_state(self) -> None:
        self.state.save(self.layout.state)


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return int(value)
