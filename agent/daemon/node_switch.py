"""The standing pointer and the node binary it names: which node must run.

`standing.node` names the node binary, `standing.node.sha256` its digest (see pointer.py). A
pointer is *applied* once the agent has recorded it durably in its state; only then does the
switch begin (stop the old node, start the new one), so a failed write never leaves a pointer
that reads "applied" while the old node runs. A pointer reads applied only while the recorded
binary is the pointer's own digest: the same pointer written again after another release was
adopted (the pointer had gone meanwhile) is applied afresh, and the adopted node is stopped.

Once a pointer is applied, the node binary is pinned to its digest: adoption (after the agent's
own restart, or a node someone started) never replaces it, and a node running any other digest
is stopped and the pointer's binary started. An agent SIGKILLed in the middle of a switch thus
finishes the switch; it never falls back to the old release. Without a pointer there is nothing
to pin to: a running node is adopted and its binary recorded (a newer node someone started by
hand is never downgraded).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from agent.base import procs
from agent.base.persist import NodeBinary
from agent.base.pointer import (
    PENDING,
    Pointer,
    Verdict,
    check_pointer,
    pointer_signature,
    read_pointer,
)
from agent.contract import NODE, PROCESS_STATES, ProgramState
from agent.daemon.context import Context
from agent.daemon.program import Program

SYNC_WATCH_S = 0.25
POST_EXEC_WAIT_S = 2.0  # how long a new process's empty command line is waited out
POST_EXEC_POLL_S = 0.02  # how often the loop looks again meanwhile
SYNC_WATCH_FOR_S = 120.0  # the fast watch's span after the new node's start; then each tick


class Running(NamedTuple):
    path: str | None  # the program file a process runs (the script, for an interpreter)
    sha256: str | None  # None: unknown (pending, or the file cannot be read)
    pending: bool  # the digest worker has yet to hash it


class NodeSwitch:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.view: dict[str, Any] = {"state": "absent", "path": None, "reason": None}
        self._seen: object = None
        self._fast_until = 0.0  # monotonic end of the fast watch for the new node's sync

    # ------------------------------------------------------------------ what must run

    def pinned_sha256(self) -> str | None:
        """The digest the node must run: the applied pointer's; None without a pointer."""
        binary = self.ctx.state.node_binary
        if binary is None or binary.source != "pointer" or read_pointer(self.ctx.layout) is None:
            return None
        return binary.sha256

    def no_binary_reason(self) -> str:
        """Why no node binary is known: no pointer, or one not taken (yet)."""
        if self.view.get("state") in ("hashing", "refused"):
            return f"no node binary: the pointer is {self.view['state']}: {self.view['reason']}"
        return "no node binary: standing.node is absent and no node runs"

    def _pinned_to(self, sha256: str) -> bool:
        """Whether the recorded node binary is this pointer digest's: a pointer written again
        after another release was adopted is applied afresh, not trusted by its key."""
        binary = self.ctx.state.node_binary
        return binary is not None and binary.source == "pointer" and binary.sha256 == sha256

    def digest_of(self, info: procs.ProcInfo, hash_it: bool = True) -> Running:
        """What a process runs (/proc/<pid>/exe, or the script it was started with; never the
        path in its argv alone), its digest from the digest worker, never hashed here: while
        the worker has not hashed it `pending` is True and the digest None. `hash_it=False`
        takes only a digest known already (a process about to be stopped is not hashed)."""
        path, source, _ = procs.running_file(info)
        if not source:
            return Running(path, None, False)
        try:
            if hash_it:
                sha256, _ = self.ctx.hasher.lookup(source)
            else:
                sha256 = self.ctx.hasher.known(source)
        except OSError:
            return Running(path, None, False)
        return Running(path, sha256, hash_it and sha256 is None)

    def verify_started(self, node: Program) -> None:
        """Right after a spawn: the process must come to run the digest it was started for
        (a file swapped between spawn_refusal's check and the exec would otherwise run under
        the pointer's name). Right after an exec /proc/<pid>/cmdline can still read empty:
        the loop looks again at its next passes, for up to POST_EXEC_WAIT_S, never waiting
        here; a process whose program still cannot be read then is stopped."""
        p = node.proc
        if p is not None:
            p.verify_until = time.monotonic() + POST_EXEC_WAIT_S
            p.runs = None
            self.check_running(node)

    def check_running(self, node: Program) -> None:
        """What the running node runs, identified again (cheap: /proc/<pid>/exe's or the
        script's device and inode, and the command line); only when that changed since it was
        last verified is its digest looked up (from the digest worker). A node that no longer
        runs the digest it must (the pointer's, else the recorded binary's) is stopped with
        the reason; one whose new digest is still being hashed claims no digest meanwhile."""
        p = node.proc
        if p is None or node.state != ProgramState.RUNNING:
            return
        info = procs.identify(p.pid)
        if info is None or info.start_ticks != p.start_ticks:
            return  # gone: its exit is booked like any other
        if not info.argv:
            if p.verify_until is not None and time.monotonic() < p.verify_until:
                return  # looked at again at the loop's next pass
            self._stop_wrong(node, f"cannot read what pid {p.pid} runs"
                             + (f" within {POST_EXEC_WAIT_S:g} s of its start"
                                if p.verify_until is not None else "")
                             + "; stopped (never kept unchecked)")
            return
        p.verify_until = None
        runs = procs.running_identity(info)
        if runs is not None and runs == p.runs:
            return
        running = self.digest_of(info)
        p.runs, p.sha256 = None, running.sha256  # verified below, else looked at again
        if running.pending:
            if p.pending_since is None:
                p.pending_since = time.monotonic()
                self.ctx.journal(f"node: pid {p.pid} now runs {running.path}; its sha256 is "
                                 f"being hashed ({PENDING})")
            return
        p.pending_since = None
        binary = self.ctx.state.node_binary
        must = self.pinned_sha256() or (binary.sha256 if binary else None)
        if running.sha256 is None:
            self._stop_wrong(node, f"cannot read what pid {p.pid} runs ({running.path})")
        elif must is not None and running.sha256 != must:
            self._stop_wrong(node, f"pid {p.pid} runs {running.path} ({running.sha256[:16]}), "
                                   f"not the node it was started as ({must[:16]})")
        else:
            p.runs, p.binary = runs, running.path

    def _stop_wrong(self, node: Program, why: str) -> None:
        self.ctx.journal(f"node: {why}")
        node.begin_stop(self.ctx.cfg.grace(node.cfg), why, as_crash=True)

    def checking(self, node: Program | None) -> bool:
        """Whether the node's program has yet to read back (the loop looks again soon)."""
        p = node.proc if node is not None and node.state == ProgramState.RUNNING else None
        return p is not None and p.verify_until is not None

    def spawn_refusal(self) -> str | None:
        """Why the node binary must not be started now, or None: before every start, its
        digest (cached by inode, size, mtime and ctime) must still be the recorded one, so a release
        replaced in place is never run under the pointer's name. The digest comes from the
        digest worker: while it is not known, the node waits."""
        binary = self.ctx.state.node_binary
        if binary is None:
            return "no node binary: standing.node is absent and no node runs"
        try:
            actual, _ = self.ctx.hasher.lookup(binary.path)
        except OSError as e:
            return f"{binary.path} cannot be read: {e.strerror or e}"
        if actual is None:  # never started on a digest not known
            return f"{binary.path}: its sha256 is not known yet ({PENDING}); not starting it yet"
        if actual != binary.sha256:
            return (f"{binary.path} has sha256 {actual[:16]}, not the {binary.source} "
                    f"{binary.sha16} (changed in place?); not starting it")
        return None

    def choose(self, found: list[procs.ProcInfo], mine: procs.ProcInfo | None
               ) -> tuple[tuple[procs.ProcInfo, Running] | None, list[procs.ProcInfo],
                          list[procs.ProcInfo]]:
        """Of the node processes found running: the one to adopt, with what it runs (None:
        start the pointer's binary once the others are gone), the ones to stop, and the ones
        whose digest is being hashed: neither adopted nor stopped until it is known, while the
        node starts nothing (a node of the pointer's digest may be among them)."""
        if not found:
            return None, [], []
        pinned = self.pinned_sha256()
        runs = {i.pid: self.digest_of(i) for i in found}
        pending = [i for i in found if runs[i.pid].pending]
        keeper: procs.ProcInfo | None
        if pinned is not None:
            good = [i for i in found if runs[i.pid].sha256 == pinned]
            keeper = mine if mine in good else max(good, key=lambda i: i.start_ticks,
                                                   default=None)
        elif read_pointer(self.ctx.layout) is None:
            keeper = max(found, key=lambda i: i.start_ticks)  # never downgrade a newer one
        else:  # a pointer not applied yet: keep what runs; following the pointer decides
            keeper = mine if mine is not None else max(found, key=lambda i: i.start_ticks)
        if keeper is not None and keeper not in pending:
            return (keeper, runs[keeper.pid]), [i for i in found if i.pid != keeper.pid], []
        if keeper is not None:
            pending = [keeper]  # the one to adopt, once its digest is known
        return None, [i for i in found if i not in pending], pending

    def adopted(self, binary: str | None, sha256: str | None) -> None:
        """Record the binary of an adopted node, unless a pointer pins another one."""
        current = self.ctx.state.node_binary
        if not binary or not sha256 or self.pinned_sha256() is not None:
            return
        if current is None or current.sha256 != sha256:
            self.ctx.state.node_binary = NodeBinary(binary, sha256, "adopted")
            self.ctx.save_state()
            self.ctx.journal(f"node: recorded running binary {binary} ({sha256[:16]})")

    # ------------------------------------------------------------------ following the pointer

    def follow(self, grace_s: float) -> None:
        """Each tick: take a changed pointer (two stats when nothing changed), and stop a node
        that runs anything but the pinned digest."""
        self._take_pointer()
        node = self.ctx.program(NODE)
        pinned = self.pinned_sha256()
        if (node is not None and pinned is not None and node.state == ProgramState.RUNNING
                and node.proc is not None and node.proc.pending_since is None
                and node.proc.sha256 != pinned):
            runs = (node.proc.sha256 or "an unknown digest")[:16]
            node.begin_stop(grace_s, f"runs {runs}, the pointer says {pinned[:16]}")

    def _take_pointer(self) -> None:
        seen = pointer_signature(self.ctx.layout)
        if seen == self._seen and self.view.get("state") not in ("refused", "pending", "hashing"):
            return  # unchanged since the last look, which applied it or found it absent
        self._seen = seen
        pointer = read_pointer(self.ctx.layout)
        state = self.ctx.state
        if pointer is None:
            self.view = {"state": "absent", "path": None, "reason": None}
            return
        if pointer.key == state.pointer_applied and self._pinned_to(pointer.digest_text):
            self.view = {"state": "applied", "path": pointer.target, "reason": None}
            return
        verdict = check_pointer(pointer, self.ctx.hasher.lookup)
        if not verdict.ok:
            self._not_taken(pointer, verdict)
            return
        assert verdict.sha256 is not None
        before = (state.node_binary, state.pointer_applied)
        state.node_binary = NodeBinary(verdict.path, verdict.sha256, "pointer")
        state.pointer_applied = pointer.key
        if not self.ctx.save_state():  # applied only once recorded: retried every tick
            self._not_recorded(pointer, verdict, before)
            return
        self.view = {"state": "applied", "path": pointer.target, "reason": None}
        self.ctx.journal(f"pointer: node binary is now {verdict.path} ({verdict.sha256[:16]})")
        self._switch_node(verdict.sha256)

    def _not_taken(self, pointer: Pointer, verdict: Verdict) -> None:
        """A pointer whose binary is still being hashed (looked at again every tick) or was
        refused: the node keeps what it runs; the reason is journaled once."""
        if verdict.pending:
            if self.view.get("reason") != verdict.reason:
                self.ctx.journal(f"pointer: {verdict.reason}; the node keeps running")
            self.view = {"state": "hashing", "path": pointer.target, "reason": verdict.reason}
            return
        if self.view.get("reason") != verdict.reason:
            self.ctx.journal(f"pointer refused: {verdict.reason}; the node keeps running")
        self.view = {"state": "refused", "path": pointer.target, "reason": verdict.reason}

    def _not_recorded(self, pointer: Pointer, verdict: Verdict,
                      before: tuple[NodeBinary | None, str | None]) -> None:
        """The state holding a taken pointer could not be saved: keep the running binary (or,
        with none to switch away from, run the pointer's and record it later)."""
        state = self.ctx.state
        reason = "cannot record the switch in run/state.json (disk full or unwritable?)"
        first = self.view.get("reason") != reason
        if before[0] is not None and before[0].sha256 != verdict.sha256:
            state.node_binary, state.pointer_applied = before  # the running one stays
            if first:
                self.ctx.journal(f"pointer: {reason}; the node keeps running until it can")
        else:  # nothing to switch away from: run the pointer's binary, record it later
            state.pointer_applied = before[1]
            if first:
                self.ctx.journal(f"pointer: {reason}; running {verdict.path} meanwhile")
        self.view = {"state": "pending", "path": pointer.target, "reason": reason}

    def _switch_node(self, sha256: str) -> None:
        """The pointer taken: time the switch and stop a node that runs another binary."""
        node = self.ctx.program(NODE)
        running = node.proc if node and node.state in PROCESS_STATES else None
        if running is None or running.sha256 != sha256:
            self._begin_timeline(running.sha256 if running else None, sha256)
        if (node and node.state == ProgramState.RUNNING and node.proc
                and node.proc.sha256 != sha256):
            node.begin_stop(self.ctx.cfg.grace(node.cfg), f"switching to {sha256[:16]}")

    # ------------------------------------------------------------------ the switch's timeline
    # What a publish reads back as the node's downtime: the old node's exit, the new process
    # up, the new node synced (wall-clock times, in the state so they survive a restart).

    def _begin_timeline(self, old_sha256: str | None, new_sha256: str) -> None:
        self.ctx.state.switch = {
            "from_sha16": old_sha256[:16] if old_sha256 else None, "to_sha16": new_sha256[:16],
            "applied_at": time.time(), "old_exit_at": None if old_sha256 else time.time(),
            "new_started_at": None, "synced_at": None, "downtime_s": None}
        self.ctx.save_state()

    def node_exited(self, sha256: str | None) -> None:
        sw = self.ctx.state.switch
        if sw and sw.get("old_exit_at") is None and (sha256 or "")[:16] != sw.get("to_sha16"):
            sw["old_exit_at"] = time.time()
            self.ctx.save_state()

    def node_started(self, sha256: str | None, started_at: float) -> None:
        sw = self.ctx.state.switch
        if sw and sw.get("new_started_at") is None and (sha256 or "")[:16] == sw.get("to_sha16"):
            sw["new_started_at"] = started_at
            self._fast_until = time.monotonic() + SYNC_WATCH_FOR_S
            self.ctx.save_state()

    def awaiting_sync(self) -> bool:
        """A switch whose new node has started but not yet reported synced: its time is
        taken from readings every SYNC_WATCH_S, not every tick, for SYNC_WATCH_FOR_S after the
        start (a node that never syncs must not keep the agent probing four times a second;
        its sync, if it comes, is then timed at a tick)."""
        sw = self.ctx.state.switch
        return (bool(sw) and sw.get("new_started_at") is not None
                and sw.get("synced_at") is None and time.monotonic() < self._fast_until)

    def node_reading(self, synced: bool, at: float, sha256: str | None) -> None:
        sw = self.ctx.state.switch
        started = sw.get("new_started_at") if sw else None
        if (not sw or sw.get("synced_at") is not None or not synced or started is None
                or at < started or (sha256 or "")[:16] != sw.get("to_sha16")):
            return
        sw["synced_at"] = at
        gone = sw.get("old_exit_at")
        sw["downtime_s"] = round(at - gone, 3) if isinstance(gone, int | float) else None
        self.ctx.save_state()
