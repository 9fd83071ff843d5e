"""Clock steps: every timer and freshness limit runs on the monotonic clock, so stepping the
wall clock the agent reads (its `time.time`) an hour back silences no RESULT line, ten minutes
ahead stops no GPU program, and neither hides the agent or its programs from `status` and
`stop`. A status file's age is judged by when the agent last saw it change, so a frozen miner
is restarted even when its file's mtime lies ahead of the wall clock."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from agentbox import Box, wait_for

from agent.daemon import probes

STEPPED = """
import os, time
_real = time.time
def stepped():  # the wall clock as the agent reads it: real time plus the step in the file
    try:
        with open(os.environ["CLOCK_STEP"]) as f:
            return _real() + float(f.read() or 0)
    except (OSError, ValueError):
        return _real()
time.time = stepped
"""


def result_lines(box: Box) -> int:
    log = box.root / "out" / "standing.log"
    return log.read_text().count("RESULT standing") if log.exists() else 0


def test_clock_steps_neither_silence_results_nor_stop_gpu_work(box: Box) -> None:
    step = box.tmp / "clock-step"
    box.env_extra["CLOCK_STEP"] = str(step)
    box.set_node_state(synced=True, blocks=1234, exec_tip=1200)
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(result_every_s=1)
    agent = box.start_agent(prelude=STEPPED)
    pids = {n: wait_for(lambda n=n: box.pid_of(n), f"{n} running")
            for n in ("node", "miner", "prover")}
    wait_for(lambda: result_lines(box) >= 1, "a first RESULT line")
    step.write_text("-3600")  # an hour back
    seen = result_lines(box)
    wait_for(lambda: result_lines(box) >= seen + 2, "RESULT lines still every second",
             timeout=15)
    step.write_text("600")  # ten minutes ahead of real time
    box.wait_ticks(25)  # 5 s: five admission checks, 25 ticks
    assert {n: box.pid_of(n) for n in pids} == pids  # nothing stopped or restarted
    assert "admission not" not in box.journal()
    assert box.status()["admission"]["admitted"] is True
    status = json.loads(box.agent_cli("status", "--config", str(box.config_path)).stdout)
    assert status["alive"] is True and status["agent_pid"] == agent.pid
    done = json.loads(box.agent_cli("stop", "--config", str(box.config_path)).stdout)
    assert done["agent"] == "stopped"
    agent.wait(timeout=30)
    wait_for(lambda: not any(box.running(n) for n in ("node", "miner", "prover")),
             "every program stopped")


def test_a_status_file_ahead_of_the_clock_still_ages(tmp_path: Path) -> None:
    f = tmp_path / "miner.json"
    f.write_text('{"hashrate": 1}')
    ahead = time.time() + 3600  # written, then the wall clock stepped an hour back
    os.utime(f, (ahead, ahead))
    assert probes.read_status_file(str(f), 0.5).healthy is True  # first sight: age unknown
    time.sleep(0.7)
    reading = probes.read_status_file(str(f), 0.5)
    assert reading.healthy is False and "unchanged" in (reading.error or "")


def test_a_frozen_miner_is_restarted_after_a_backward_step(box: Box) -> None:
    box.configure(programs=("miner",), program_overrides={"miner": {
        "health_max_age_s": 1.5, "restart_unhealthy_after_s": 1.0}})
    box.start_agent()
    wait_for(lambda: box.program("miner").get("healthy") is True, "miner healthy")
    pid = box.pid_of("miner")
    os.kill(pid, signal.SIGSTOP)  # frozen: its status file stops changing
    try:
        ahead = time.time() + 3600
        os.utime(box.root / "run" / "miner.json", (ahead, ahead))
        wait_for(lambda: box.pid_of("miner") not in (None, pid), "the miner restarted", 15)
    finally:
        with contextlib.suppress(ProcessLookupError):  # restarted: the frozen one is gone
            os.kill(pid, signal.SIGCONT)
