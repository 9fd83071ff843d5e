"""The miner's pack: re-exported whenever the node's seed changes, then the miner restarted.

The running export is recorded in the state (tasks.pack). An agent started after a SIGKILL that
finds an export still running stops it and exports again: that export's exit status is lost, so
its pack cannot be trusted, and two exports must never write one pack at once.
"""

from __future__ import annotations

import time
from typing import Any

from agent.base.template import render_argv
from agent.contract import MINER, ProgramState
from agent.daemon.context import Context
from agent.daemon.probes import Reading
from agent.daemon.tasks import Task

KIND = "pack"


class PackExport:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.task: Task | None = None
        self.seed: str | None = None  # the seed the running export is for
        self.error: dict[str, Any] | None = None
        self.held = False  # the running export was stopped because the miner may not run

    def resume(self) -> Task | None:
        """At the agent's start: stop an export the previous agent left running."""
        record = self.ctx.state.tasks.get(KIND)
        if record is None:
            return None
        task = Task.adopt(KIND, record, self.ctx.cfg.miner_pack.timeout_s)
        if task is None:
            self.ctx.state.tasks.pop(KIND, None)
            self.ctx.save_state()
            return None
        self.ctx.journal(f"pack: an export the previous agent started (pid {task.pid}) still "
                         "runs; its outcome cannot be known: stopping it to export again")
        task.stop("left by the previous agent", self.ctx.journal)
        self.task, self.seed = task, None
        return task

    def maybe_export(self, node: Reading | None, miner: Reading | None) -> None:
        state, pc = self.ctx.state, self.ctx.cfg.miner_pack
        seed = node.data.get("seed") if node and node.data else None
        prog = self.ctx.program(MINER)
        if not isinstance(seed, str) or not seed or seed == state.pack_seed:
            return
        if prog is None or self.task is not None or not self.ctx.wanted(prog):
            return
        if state.pack_seed is None and miner and miner.data and miner.data.get("seed") == seed:
            state.pack_seed = seed  # first sight: the miner already mines this seed
            self.ctx.save_state()
            return
        if not pc.command:
            return
        err = self.error
        if err and err["seed"] == seed and time.monotonic() < err["mono"] + pc.retry_s:
            return
        argv = render_argv(pc.command, {**self.ctx.values(MINER), "seed": seed})
        task = self.ctx.start_task(KIND, argv, self.ctx.layout.pack_log, pc.timeout_s, seed=seed)
        if task is None:
            self.error = {"seed": seed, "mono": time.monotonic(), "rc": None,
                          "outcome": "not started", "at": time.time()}
            return
        self.task, self.seed = task, seed
        self.ctx.journal(f"pack: node seed is now {seed}; exporting: {' '.join(argv)}")

    def hold(self) -> None:
        """An export runs the miner's binary on the GPU: admission refusing the miner stops a
        running one too (it runs again for the same seed once admitted)."""
        miner = self.ctx.program(MINER)
        if self.task is None or self.held or miner is None or self.ctx.wanted(miner):
            return
        self.held = True
        self.task.stop("the miner may not run: admission refuses it", self.ctx.journal)

    def done(self, task: Task, code: int | None) -> None:
        seed, self.task, self.seed = self.seed, None, None
        if seed is None:  # the export left by a previous agent, stopped: export again now
            self.ctx.journal("pack: the earlier export is gone")
            return
        if self.held:
            self.held = False
            self.ctx.journal(f"pack: export for seed {seed} stopped; it runs again once the "
                             "miner may run")
            return
        outcome = "timeout" if task.timed_out else "ok" if code == 0 else "failed"
        if outcome == "ok":
            self.ctx.state.pack_seed = seed
            self.error = None
            self.ctx.save_state()
            self.ctx.journal(f"pack: exported for seed {seed}; restarting the miner")
            miner = self.ctx.program(MINER)
            if miner and miner.state == ProgramState.RUNNING:
                miner.begin_stop(self.ctx.cfg.grace(miner.cfg), f"new pack for seed {seed}")
            return
        self.error = {"seed": seed, "mono": time.monotonic(), "rc": code, "outcome": outcome,
                      "at": time.time()}
        self.ctx.journal(f"pack: export {outcome} (exit {code}); retry in "
                         f"{self.ctx.cfg.miner_pack.retry_s:.0f} s")

    def view(self) -> dict[str, Any]:
        err = self.error
        return {
            "seed": self.ctx.state.pack_seed,
            "exporting": self.seed,
            "last_error": None if not err else {
                "seed": err.get("seed"), "rc": err.get("rc"), "outcome": err.get("outcome"),
                "error": err.get("error"), "at": err.get("at")},
        }
