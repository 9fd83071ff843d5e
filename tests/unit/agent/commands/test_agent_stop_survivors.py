"""Stops at their edges: an old node that survives SIGKILL during a switch, `agent
stop` meeting one, the escalation's wording, an adopted task after a clock step, and a switch
waiting on another's lock."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time

import pytest
from agentbox import Box, wait_for

from agent.base import procs, stopping
from agent.base.config import load_config
from agent.base.stopping import Stopping
from agent.commands import stop as stopper
from agent.commands import switch as switch_cmd
from agent.daemon.tasks import Task

DEAF = '''
import os
from agent.base import procs as _p
from agent.base import stopping as _s
_real = _p.signal_program
def _deaf(pid, pgid, sig):  # the listed pids are in D state: no signal has any effect
    f = os.environ["DEAF_PIDS"]
    if os.path.exists(f) and str(pid) in open(f).read().split():
        return
    _real(pid, pgid, sig)
_p.signal_program = _deaf
_s.KILL_WAIT_S = 0.5
'''


def test_an_old_node_surviving_sigkill_has_a_status_reason(box: Box) -> None:
    path1, sha1 = box.release("v1")
    path2, sha2 = box.release("v2")
    deaf = box.tmp / "deaf"
    box.env_extra["DEAF_PIDS"] = str(deaf)
    box.point(path1, sha1)
    box.configure(programs=("node",), stop_grace_s=0.5)
    box.start_agent(DEAF)
    old = wait_for(lambda: box.pid_of("node"), "v1 running")
    deaf.write_text(str(old))
    box.point(path2, sha2)
    wait_for(lambda: "survived SIGKILL" in (box.program("node").get("reason") or ""),
             "a reason naming the survivor", 15)
    assert str(old) in box.program("node")["reason"]


def test_agent_stop_never_reports_a_survivor_stopped(box: Box,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path, sha = box.release("v2")
    box.point(path, sha)
    box.configure(programs=("node",), stop_grace_s=0.3)
    agent = box.start_agent()
    pid = wait_for(lambda: box.pid_of("node"), "node running")
    box.kill_agent(agent)
    real = procs.signal_program
    monkeypatch.setattr(procs, "signal_program",
                        lambda p, g, sig: None if p == pid else real(p, g, sig))
    monkeypatch.setattr(stopping, "KILL_WAIT_S", 0.3)
    monkeypatch.setattr(stopper, "KILL_WAIT_S", 0.3)
    cfg = load_config(box.config_path)
    out = stopper.stop_all(cfg)
    assert procs.identify(pid) is not None
    assert "node" not in out["stopped_without_agent"]
    assert out["survivors"] and "survived SIGKILL" in out["survivors"][0]
    assert str(pid) in out["survivors"][0]
    assert cfg.layout.pidfile("node").exists()  # still names the process that runs


def test_agent_stop_exits_non_zero_on_a_survivor(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent import cli

    monkeypatch.setattr(cli, "load_config", lambda _: None)
    monkeypatch.setattr(stopper, "stop_all", lambda _: {"survivors": ["node pid 1 ..."]})
    assert cli.main(["stop"]) != 0


def test_the_sigkill_escalation_tells_the_real_interval() -> None:
    told: list[str] = []
    stop = Stopping("node", 2**22 + 7, 2**22 + 7, 0.0, "test", told.append, now=100.0)
    stop.enforce(100.0 + stopping.KILL_WAIT_S + 2.5)
    assert f"still there {stopping.KILL_WAIT_S + 2.5:.1f} s after SIGKILL" in told[-1]


def test_an_adopted_task_is_aged_by_its_process_not_the_wall_clock() -> None:
    p = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        time.sleep(0.2)
        info = procs.identify(p.pid)
        assert info is not None
        # started 0.2 s ago; the wall clock has since stepped an hour ahead
        record = dict(info.record(), argv=["sleep", "30"], started_at=time.time() - 3600)
        task = Task.adopt("recovery", record, timeout_s=600)
        assert task is not None
        task.enforce_deadline(time.monotonic(), lambda _: None)
        assert not task.timed_out
    finally:
        p.kill()
        p.wait()


def test_a_switch_waits_for_the_lock_only_so_long(box: Box,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path, sha = box.release("v1")
    box.configure(programs=("node",))
    cfg = load_config(box.config_path)
    cfg.layout.run.mkdir(parents=True, exist_ok=True)
    holder = os.open(cfg.layout.switch_lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX)
    monkeypatch.setattr(switch_cmd, "LOCK_WAIT_S", 0.5)
    try:
        t0 = time.monotonic()
        result, code = switch_cmd.switch(cfg, str(path), sha, 1.0, 5.0)
        assert time.monotonic() - t0 < 5
        assert result["outcome"] == "refused" and code == 1
        assert "another switch" in result["reason"]
        assert not cfg.layout.pointer.exists()  # nothing written
    finally:
        os.close(holder)


