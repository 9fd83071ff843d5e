"""An applied pointer is checked against the running node at every reconcile: a node that,
after the check at its start, comes to run another release (a script that execs it) is
stopped with the reason, and the status never claims the pointer's digest for it."""

from __future__ import annotations

import hashlib

import psutil
import pytest
from agentbox import PY, Box, wait_for


@pytest.mark.parametrize("exec_line", ["exec {v2} \"$@\"", "exec -a \"$0\" {py} {v2} \"$@\""],
                         ids=["plain", "argv0-forged"])
def test_a_node_that_execs_another_release_after_its_start_is_stopped(
        box: Box, exec_line: str) -> None:
    """Also when it keeps the pointer's script as its argv[0] (`exec -a "$0"` under an
    interpreter): an interpreter's argv[0] never names the script it runs."""
    v2, _ = box.release("v2")
    gate = box.tmp / "exec-gate"  # the script execs v2 once this exists
    text = (f"#!/bin/bash\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n"
            f"{exec_line.format(v2=v2, py=PY)}\n")
    sha = hashlib.sha256(text.encode()).hexdigest()
    path = box.root / "releases" / sha[:16] / "node"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    path.chmod(0o755)
    box.point(path, sha)
    box.configure(programs=("node",))
    box.start_agent()
    wait_for(lambda: box.program("node").get("sha16") == sha[:16]
             and box.pid_of("node") is not None, "the pointer's script running")
    pid = box.pid_of("node")
    assert pid is not None
    box.wait_ticks(2)  # past the check right after its start
    gate.write_text("")
    wait_for(lambda: "not the node it was started as" in box.journal(), "the exec noticed")
    wait_for(lambda: not psutil.pid_exists(pid)
             or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, "the exec'd node stopped")
    assert f"pid {pid} runs {v2}" in box.journal()
    wait_for(lambda: box.program("node").get("pid") != pid, "the status past that pid")
