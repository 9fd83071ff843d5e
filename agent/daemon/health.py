"""Unhealthy programs: one that runs but whose status source says unhealthy (a node that does
not answer its RPC, a status file gone stale) for `restart_unhealthy_after_s` is stopped, and
the supervisor starts it again. A reading too old to tell (see freshness.py) decides nothing:
neither a restart nor an all-clear.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from agent.base.config import Config
from agent.contract import ProgramState
from agent.daemon.probes import Reading
from agent.daemon.program import Program


def restart_unhealthy(cfg: Config, programs: Iterable[Program],
                      readings: dict[str, Reading]) -> None:
    now = time.monotonic()
    for prog in programs:
        reading = readings.get(prog.name)
        if reading is not None and reading.stale:
            continue
        if prog.state != ProgramState.RUNNING or prog.proc is None or reading is None:
            prog.unhealthy_since = None
            continue
        if reading.healthy is not False:
            prog.unhealthy_since = None
            continue
        if prog.unhealthy_since is None:
            prog.unhealthy_since = now
        limit = prog.cfg.restart_unhealthy_after_s
        old_enough = now - prog.proc.started_mono >= max(cfg.stable_s, limit)
        if limit and old_enough and now - prog.unhealthy_since >= limit:
            prog.begin_stop(cfg.grace(prog.cfg), f"unhealthy: {reading.error}")
