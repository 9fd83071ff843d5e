"""`python -m agent status`: the last status.json, and whether the agent that wrote it is alive.

Alive: the agent that run/agent.pid names still runs (see stop.live_agent) and its heartbeat is
at most three ticks old, plus slack. The status's own age shows a live agent that cannot write
it; `disk` shows a full disk, the usual reason.
"""

from __future__ import annotations

import os
import time
from typing import cast

from agent.base.config import Config
from agent.base.files import read_json
from agent.commands.stop import live_agent
from agent.contract import DiskDoc, Layout, StatusDoc


def status(cfg: Config) -> StatusDoc:
    layout = cfg.layout
    current = read_json(layout.status)
    pid = live_agent(cfg)
    now = time.time()
    try:  # the agent touches the heartbeat file every tick
        age: float | None = round(max(0.0, now - layout.heartbeat.stat().st_mtime), 3)
    except OSError:
        age = None
    fresh = age is not None and age <= 3 * cfg.tick_s + 5.0
    # status.json as the agent wrote it (a StatusFile), or a word that there is none yet
    out = cast(StatusDoc, current if isinstance(current, dict) else {"error": "no status yet"})
    try:  # how old the status itself is: a live agent that cannot write it shows here
        status_age: float | None = round(max(0.0, now - layout.status.stat().st_mtime), 3)
    except OSError:
        status_age = None
    out["alive"], out["agent_pid"] = pid is not None and fresh, pid
    out["heartbeat_age_s"], out["status_age_s"] = age, status_age
    out["disk"] = disk_space(layout)
    return out


FULL_BELOW_BYTES = 1 << 20  # less than this free under run/ or out/ reads as a full disk


def disk_space(layout: Layout) -> DiskDoc:
    """Free and total bytes where the agent writes (run/ and out/); `full` when either is
    nearly out."""
    free: dict[str, int | None] = {}
    total: dict[str, int | None] = {}
    for name, path in (("run", layout.run), ("out", layout.out)):
        try:
            st = os.statvfs(path)
            free[name], total[name] = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        except OSError:
            free[name] = total[name] = None
    known = [v for v in free.values() if v is not None]
    return {"free_bytes": free, "total_bytes": total,
            "full": bool(known) and min(known) < FULL_BELOW_BYTES}
