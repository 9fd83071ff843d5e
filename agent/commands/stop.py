"""`python -m agent stop`: stop the agent (it stops its programs), then anything left.

The agent is asked with SIGUSR1 (SIGTERM would make it exit and leave the programs running,
which is how it is restarted or upgraded). Programs still running afterwards, because no agent
ran or it died, are found by pidfile and by command line and stopped as process groups. One
that survives SIGKILL is listed under `survivors` (its pidfile kept) and the command fails.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from agent.base import procs
from agent.base.config import Config
from agent.base.errors import AgentError
from agent.base.files import read_json
from agent.base.identity import instances
from agent.base.journal import Journal
from agent.base.stopping import KILL_WAIT_S, Stopping

POLL_S = 0.1


def live_agent(cfg: Config) -> int | None:
    """The pid of the running agent of this root, or None.

    run/agent.pid holds the pid; the heartbeat file holds that process's identity (start ticks
    since boot and the boot id, never a wall-clock time), so a pid reused by another process
    after the agent died is not taken for the agent, and a clock step changes nothing."""
    try:
        pid = int(cfg.layout.agent_pid.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    record = read_json(cfg.layout.heartbeat)
    if not isinstance(record, dict) or record.get("pid") != pid:
        return None
    return pid if procs.from_record(record) is not None else None


def stop_all(cfg: Config) -> dict[str, Any]:
    pid = live_agent(cfg)
    agent = "not running"
    if pid is not None:
        os.kill(pid, signal.SIGUSR1)
        limit = max((cfg.grace(p) for p in cfg.programs.values()), default=cfg.stop_grace_s)
        if not _wait_gone([pid], limit + 15.0):
            raise AgentError(f"the agent (pid {pid}) did not stop within {limit + 15:.0f} s")
        agent = "stopped"
    stopped, survivors = [], []
    journal = _journal(cfg)
    for name, prog in cfg.programs.items():
        found = instances(cfg, name)
        if not found:
            continue
        grace = cfg.grace(prog)
        stops = [Stopping(name, i.pid, i.pgid, grace, "agent stop", journal) for i in found]
        _wait_stopped(found, stops, grace + KILL_WAIT_S)
        left = [f"{name} pid {info.pid} survived SIGKILL {stop.kills} time(s) (uninterruptible "
                "sleep?)" for info, stop in zip(found, stops, strict=True)
                if procs.is_same(info.pid, info.start_ticks)]
        if left:  # its pidfile still names what runs; it is not reported stopped
            survivors += left
            continue
        for info in found:
            procs.kill_group_leftovers(info.pgid if info.pgid == info.pid else -1)
        cfg.layout.pidfile(name).unlink(missing_ok=True)
        stopped.append(name)
    return {"agent": agent, "stopped_without_agent": stopped, "survivors": survivors}


def _journal(cfg: Config) -> Callable[[str], None]:
    """The agent's log, where the stop escalations are told as the agent tells its own."""
    try:
        journal = Journal(cfg.layout.agent_log)
    except OSError:
        return lambda _: None
    return lambda message: journal(f"agent stop: {message}")


def _wait_stopped(found: list[procs.ProcInfo], stops: list[Stopping], limit_s: float) -> None:
    """Escalate each stop until its process is gone or limit_s has passed."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        now = time.monotonic()
        alive = [stop for info, stop in zip(found, stops, strict=True)
                 if procs.is_same(info.pid, info.start_ticks)]
        if not alive:
            return
        for stop in alive:
            stop.enforce(now)
        time.sleep(POLL_S)


def _wait_gone(pids: list[int], timeout: float) -> bool:
    started = {pid: procs.start_ticks_of(pid) for pid in pids}
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p, t in started.items() if t is not None and procs.is_same(p, t)]
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
