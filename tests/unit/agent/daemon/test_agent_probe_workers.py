"""Each program is probed by a worker of its own: a status-file read that hangs (here a FIFO
opened the way a hung file system holds a read) makes only that program's reading unknown.
The node's RPC is still probed, so a SIGSTOPped node is restarted, and the hung probe's thread
is never replaced by another (the threads stay bounded at one per program)."""

from __future__ import annotations

import os
import signal

import psutil
from agentbox import Box, wait_for

# a read that hangs where no deadline reaches: the FIFO opened blocking, with no writer ever
HUNG_READ = '''
import os, stat
from agent.daemon import probes as _probes
_real_read = _probes.read_status_file
def _read(path, max_age_s):
    if stat.S_ISFIFO(os.stat(path).st_mode):
        os.open(path, os.O_RDONLY)  # blocks for ever: no writer comes
    return _real_read(path, max_age_s)
_probes.read_status_file = _read
'''


def test_a_hung_status_file_read_blinds_no_other_probe(box: Box) -> None:
    fifo = box.root / "run" / "miner.fifo"
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(programs=("miner", "node"),  # the hung probe first in the config
                  program_overrides={"miner": {"status_file": str(fifo)},
                                     "node": {"restart_unhealthy_after_s": 1.0}})
    agent = box.start_agent(HUNG_READ)
    wait_for(lambda: box.status()["observer"]["hung"] == ["miner"], "the miner's probe hung")
    assert box.program("miner")["healthy"] is None  # unknown, never the last good verdict
    first = wait_for(lambda: box.program("node").get("healthy") and box.pid_of("node"),
                     "the node probed while the miner's probe hangs")
    os.kill(first, signal.SIGSTOP)
    wait_for(lambda: box.pid_of("node") not in (None, first), "the stopped node restarted", 30)
    assert "unhealthy" in box.journal()
    threads = [t.id for t in psutil.Process(agent.pid).threads()]
    # the main loop, one worker per program, at most one NVML check in flight
    assert len(threads) <= 1 + 2 + 1, threads
    assert box.status()["observer"]["restarts"] == 0
