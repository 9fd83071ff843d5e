"""A `--foreground` agent whose stderr pipe closes (the terminal or the pipe reader gone) keeps
supervising: its journal goes on in log/agent.log, only the echo stops."""

from __future__ import annotations

import os
import signal
import subprocess

from agentbox import PY, Box, wait_for


def test_a_foreground_agent_survives_its_stderr_closing(box: Box) -> None:
    box.configure(programs=("miner",))
    agent = subprocess.Popen([PY, "-m", "agent", "run", "--foreground", "--config",
                              str(box.config_path)], env=box.env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    box.agents.append(agent)
    first = wait_for(lambda: box.pid_of("miner"), "the miner up")
    assert agent.stderr is not None
    agent.stderr.close()  # the reader is gone: every echo now meets EPIPE
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: box.pid_of("miner") not in (None, first), "the miner restarted", 15)
    box.wait_ticks(3)
    assert agent.poll() is None, box.journal()
    assert "stderr closed" in box.journal()
