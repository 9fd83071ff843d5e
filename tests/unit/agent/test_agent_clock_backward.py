"""A status file's age after a backward wall-clock step: judged by when the agent last saw it
change (monotonic), so a frozen miner is restarted even when its file's mtime lies ahead of the
wall clock."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from agentbox import Box, wait_for

from agent.daemon import probes


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
