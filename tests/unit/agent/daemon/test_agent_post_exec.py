"""The check right after a spawn: what the new process runs is read (bounded wait) and must be
what it was started as; a process whose program cannot be read is stopped, never kept."""

from __future__ import annotations

import subprocess

from agentbox import RACE, Box, gone, wait_for

# the kernel's window right after an exec: /proc/<pid>/cmdline still reads empty for the first
# looks at a process (seen 10 times in 200 spawns on a busy box); EMPTY_LOOKS of them
EMPTY_CMDLINE_AT_FIRST = '''
import os
from agent.base import procs as _procs
_real_identify, _looks = _procs.identify, {}
def _identify(pid):
    info = _real_identify(pid)
    _looks[pid] = _looks.get(pid, 0) + 1
    if info is not None and _looks[pid] <= int(os.environ.get("EMPTY_LOOKS", "3")):
        return _procs.ProcInfo(info.pid, info.start_ticks, (), info.pgid, info.ppid)
    return info
_procs.identify = _identify
'''

def test_a_swapped_node_is_stopped_even_while_its_cmdline_reads_empty(box: Box) -> None:
    path1, _ = box.release("v1")
    path2, sha2 = box.release("v2")
    trig = box.tmp / "trigger"
    box.env_extra.update(RACE_TRIGGER=str(trig), RACE_SRC=str(path1), RACE_DST=str(path2))
    box.point(path2, sha2)
    box.configure(programs=("node",))
    box.start_agent(RACE + EMPTY_CMDLINE_AT_FIRST)
    wait_for(lambda: box.invocations("node") and box.pid_of("node"), "v2 up")
    trig.write_text("x")
    subprocess.run(["kill", "-KILL", str(box.pid_of("node"))], check=True)
    wait_for(lambda: not trig.exists(), "the swap between check and exec")
    wait_for(lambda: box.program("node").get("state") == "blocked", "the node refused", 15)
    assert "not the node it was started as" in box.journal()
    assert not box.running("node")


def test_a_node_whose_program_cannot_be_read_after_the_exec_is_stopped(box: Box) -> None:
    path2, sha2 = box.release("v2")
    box.env_extra.update(EMPTY_LOOKS="1000000000")  # its cmdline never reads
    box.point(path2, sha2)
    box.configure(programs=("node",))
    box.start_agent(EMPTY_CMDLINE_AT_FIRST)
    wait_for(lambda: "cannot read what pid" in box.journal(), "the unreadable node told", 15)
    line = next(ln for ln in box.journal().splitlines() if "cannot read what pid" in ln)
    pid = int(line.split("cannot read what pid ")[1].split()[0])
    wait_for(lambda: gone(pid), "the node whose program cannot be read stopped", 15)
    # the journal says so once the agent has reaped it, a moment after the process is gone
    wait_for(lambda: f"pid {pid} stopped" in box.journal(), "its stop in the journal", 15)
