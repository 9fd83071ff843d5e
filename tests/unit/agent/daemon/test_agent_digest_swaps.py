"""The digest rule under attack: a release rewritten in place with its mtime put back, a path
swapped between the check and the exec, a script changed under a running node, and special
files where a release should be."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from agentbox import RACE, Box, wait_for

from agent.base.files import DigestCache


def _rewrite_keeping_mtime(path: Path, content: bytes) -> None:
    """Same size, same inode, mtime put back (`touch -d`): only the ctime tells."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(content)
        f.truncate()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_digest_cache_sees_a_same_size_rewrite_with_its_mtime_restored(tmp_path: Path) -> None:
    path = tmp_path / "node"
    path.write_bytes(b"version one")
    cache = DigestCache()
    first = cache.sha256(path)
    time.sleep(0.01)  # the ctime moves on
    _rewrite_keeping_mtime(path, b"version two")
    assert cache.sha256(path) != first


def test_same_size_rewrite_with_restored_mtime_never_runs(box: Box) -> None:
    path1, _ = box.release("v1")
    path2, sha2 = box.release("v2")
    box.point(path2, sha2)
    box.configure(programs=("node",))
    box.start_agent()
    wait_for(lambda: box.invocations("node") and box.pid_of("node"), "v2 up")
    assert path1.stat().st_size == path2.stat().st_size
    _rewrite_keeping_mtime(path2, path1.read_bytes())
    subprocess.run(["kill", "-KILL", str(box.pid_of("node"))], check=True)
    # blocked while the changed file is hashed (off the loop), then refused by its digest
    wait_for(lambda: box.program("node").get("state") == "blocked"
             and "changed in place" in box.program("node")["reason"], "the node refused", 15)
    assert [r["version"] for r in box.invocations("node")] == ["v2"]


def test_a_node_swapped_between_check_and_exec_is_stopped(box: Box) -> None:
    path1, _ = box.release("v1")
    path2, sha2 = box.release("v2")
    trig = box.tmp / "trigger"
    box.env_extra.update(RACE_TRIGGER=str(trig), RACE_SRC=str(path1), RACE_DST=str(path2))
    box.point(path2, sha2)
    box.configure(programs=("node",))
    box.start_agent(RACE)
    wait_for(lambda: box.invocations("node") and box.pid_of("node"), "v2 up")
    trig.write_text("x")
    subprocess.run(["kill", "-KILL", str(box.pid_of("node"))], check=True)
    wait_for(lambda: not trig.exists(), "the swap between check and exec")
    wait_for(lambda: box.program("node").get("state") == "blocked", "the node refused", 15)
    assert "not the node it was started as" in box.journal()  # the spawned one was stopped
    assert not box.running("node")


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_a_release_replaced_by_a_special_file_neither_hangs_nor_spins(box: Box,
                                                                      kind: str) -> None:
    path2, sha2 = box.release("v2")
    box.point(path2, sha2)
    box.configure(programs=("node",))
    agent = box.start_agent()
    wait_for(lambda: box.invocations("node") and box.pid_of("node"), "v2 up")
    tmp = path2.with_name("node.tmp")
    if kind == "fifo":
        os.mkfifo(tmp)
    else:
        os.symlink("/dev/zero", tmp)
    os.replace(tmp, path2)
    subprocess.run(["kill", "-KILL", str(box.pid_of("node"))], check=True)
    time.sleep(1.0)
    p = psutil.Process(agent.pid)
    t0, c0 = box.ticks(), sum(p.cpu_times()[:2])
    time.sleep(3.0)
    t1, c1 = box.ticks(), sum(p.cpu_times()[:2])
    assert t1 - t0 >= 5, "the loop stopped ticking"
    assert c1 - c0 < 1.5, "the agent spins"
    node = box.program("node")
    assert node["state"] == "blocked" and "not a regular file" in node["reason"]
