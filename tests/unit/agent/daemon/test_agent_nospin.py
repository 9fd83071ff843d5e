"""No spin, and one way to stop a process: a node in crash-loop backoff while an old node is
still being stopped waits, blocked with the reason, on a timer; an old node that survives
SIGKILL is killed again every few seconds, one log line each time, and the node's status says
why it is down."""

from __future__ import annotations

import time

import psutil
from agentbox import UNKILLABLE, Box, free_port, spawn_ignoring_sigterm, wait_for


def test_a_node_waiting_for_an_unkillable_old_one_is_blocked_without_spinning(box: Box) -> None:
    path1, _ = box.release("v1")
    path2, sha2 = box.release("v2")
    box.point(path2, sha2)
    # the pointer's node crashes at once: it is in crash-loop backoff
    box.configure(stop_grace_s=0.3, tick_s=1.0, reconcile_s=1.0, program_overrides={"node": {
        "command": ["{node_bin}", "node", "--crash-unless", str(box.tmp / "healthy")]}})
    agent = box.start_agent(prelude=UNKILLABLE)
    wait_for(lambda: box.program("node").get("failures", 0) >= 1, "the node crash-looping")
    # a node someone started by hand, not the pointer's, that will not die
    # the agent may find it and send SIGTERM before its interpreter could set SIGTERM aside
    old = spawn_ignoring_sigterm([str(path1), "node", "--ignore-term", "--rpc-port",
                                  str(free_port())])
    box.agents.append(old)  # killed at teardown
    node = wait_for(lambda: "survived SIGKILL" in (box.program("node").get("reason") or "")
                    and box.program("node"), "the node blocked on the old one")
    assert node["state"] == "blocked"
    assert node["reason"].startswith(f"waiting for pid {old.pid} to exit")
    proc = psutil.Process(agent.pid)
    before, started = sum(proc.cpu_times()[:2]), time.monotonic()
    time.sleep(3.0)
    used = sum(proc.cpu_times()[:2]) - before
    assert used < 1.0, f"the agent used {used:.2f} s of CPU in 3 s: a busy wait"
    assert time.monotonic() - started >= 3.0
    journal = box.journal()
    assert f"node: stopping pid {old.pid} (not the node the pointer names" in journal
    assert journal.count(f"node: pid {old.pid} ignored SIGTERM; sending SIGKILL") == 1
    assert journal.count(f"node: pid {old.pid} still there") >= 3  # one line per escalation
    assert agent.poll() is None and old.poll() is None
    old.kill()  # it dies at last: the pointer's node is started
    (box.tmp / "healthy").write_text("")
    wait_for(lambda: box.program("node").get("state") == "running", "the pointer's node runs")
    assert box.program("node")["sha16"] == sha2[:16]
