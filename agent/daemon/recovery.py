"""Exec-snapshot recovery: when the node is synced above `min_blocks` but its exec tip reads 0,
run the recipe (in/box-exec-snapshot.sh), at most once per cooldown and never two at once.

The running recipe is recorded in the state (tasks.recovery); an agent started after a SIGKILL
waits for a recipe that still runs rather than starting another beside it. The cooldown runs on
the monotonic clock (seeded at the start from the recorded wall-clock end, at most one cooldown
ahead), so a clock step neither extends nor skips it. It acts only on a fresh reading (see
freshness.py): a frozen "exec tip 0" is unknown, not stuck.
"""

from __future__ import annotations

import math
import time
from typing import Any

from agent.base.template import render_argv
from agent.daemon.context import Context
from agent.daemon.probes import Reading
from agent.daemon.tasks import Task

KIND = "recovery"


class ExecRecovery:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.task: Task | None = None
        finished = ctx.state.recovery.get("finished_at")
        left = (finished + ctx.cfg.recovery.cooldown_s - time.time()
                if isinstance(finished, int | float) else 0.0)
        cooldown = ctx.cfg.recovery.cooldown_s
        self.cooldown_until = time.monotonic() + min(max(left, 0.0), cooldown)

    def resume(self) -> Task | None:
        """At the agent's start: adopt the recipe the previous agent left running, if any."""
        state, rc = self.ctx.state, self.ctx.cfg.recovery
        record = state.tasks.get(KIND)
        task = Task.adopt(KIND, record, rc.timeout_s) if record else None
        if task is not None:
            self.task = task
            self.ctx.journal(f"recovery: the recipe the previous agent started (pid {task.pid}) "
                             "still runs; waiting for it")
            return task
        changed = state.tasks.pop(KIND, None) is not None
        if state.recovery.get("state") == "running":  # it ended while no agent watched
            state.recovery.update(state="idle", outcome="interrupted", finished_at=time.time())
            self.cooldown_until = time.monotonic() + rc.cooldown_s
            changed = True
        if changed:
            self.ctx.save_state()
        return None

    def maybe_start(self, node: Reading | None) -> None:
        rc = self.ctx.cfg.recovery
        if not rc.recipe or self.task is not None or node is None or not node.data:
            return
        data = node.data
        stuck = (data.get("synced") is True and _int(data.get("blocks")) > rc.min_blocks
                 and _int(data.get("exec_tip"), -1) == 0)
        if not stuck:
            return
        if time.monotonic() < self.cooldown_until:
            return
        argv = render_argv(rc.recipe, self.ctx.values())
        task = self.ctx.start_task(KIND, argv, self.ctx.layout.recovery_log, rc.timeout_s)
        if task is None:
            return
        self.task = task
        runs = _int(self.ctx.state.recovery.get("runs"), 0) + 1
        self.ctx.state.recovery = {"state": "running", "runs": runs,
                                   "started_at": task.started_at,
                                   "blocks": data.get("blocks"), "argv": argv}
        self.ctx.save_state()
        self.ctx.journal(f"recovery: node synced at {data.get('blocks')} blocks with exec tip 0; "
                         f"running {' '.join(argv)}")

    def done(self, task: Task, code: int | None) -> None:
        self.task = None
        if task.timed_out:
            outcome = "timeout"
        elif task.adopted:
            outcome = "ok" if code == 0 else "unknown" if code is None else "failed"
        else:
            outcome = "ok" if code == 0 else "failed"
        took = time.time() - task.started_at
        self.ctx.state.recovery.update(state="idle", finished_at=time.time(), rc=code,
                                       outcome=outcome)
        self.cooldown_until = time.monotonic() + self.ctx.cfg.recovery.cooldown_s
        self.ctx.save_state()
        self.ctx.journal(f"recovery: {outcome} (exit {code}) after {took:.1f} s; "
                         f"cooldown {self.ctx.cfg.recovery.cooldown_s:.0f} s")

    def view(self, now: float) -> dict[str, Any]:
        cfg, rec = self.ctx.cfg.recovery, self.ctx.state.recovery
        cooldown_until = None
        state = "running" if self.task is not None else "idle"
        left = self.cooldown_until - time.monotonic()
        if state == "idle" and left > 0:
            state, cooldown_until = "cooldown", now + left
        return {
            "configured": bool(cfg.recipe),
            "state": state,
            "adopted": self.task.adopted if self.task is not None else None,
            "pid": self.task.pid if self.task is not None else None,
            "runs": rec.get("runs", 0),
            "last_started_at": rec.get("started_at"),
            "last_finished_at": rec.get("finished_at"),
            "last_rc": rec.get("rc"),
            "last_outcome": rec.get("outcome"),
            "cooldown_until": cooldown_until,
        }


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return int(value)
