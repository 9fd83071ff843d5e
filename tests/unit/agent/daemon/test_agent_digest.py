"""The running node is the pointer's: the release's digest is checked before every start (a
file replaced in place is refused with a reason, never run), and a node found running is known
by what it runs (/proc/<pid>/exe, or its script), not by the path in its argv."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from agentbox import Box, wait_for

from agent.base import procs
from agent.base.config import parse_config
from agent.base.journal import Journal
from agent.daemon.supervisor import Supervisor


def test_a_release_replaced_in_place_is_never_started(box: Box) -> None:
    path1, sha1 = box.release("v1")
    path2, sha2 = box.release("v2")
    box.point(path2, sha2)
    box.configure()
    box.start_agent()
    wait_for(lambda: box.program("node").get("sha16") == sha2[:16]
             and box.program("node").get("state") == "running", "v2 running")
    wait_for(lambda: box.invocations("node"), "v2 recorded its start")
    good = path2.read_bytes()
    with open(path2, "r+b") as f:  # v1's content at v2's path: same inode, new mtime
        f.write(path1.read_bytes())
        f.truncate()
    pid = box.pid_of("node")
    assert pid is not None
    subprocess.run(["kill", "-KILL", str(pid)], check=True)
    # blocked while the changed file is hashed (off the loop), then refused by its digest
    node = wait_for(lambda: box.program("node").get("state") == "blocked"
                    and "changed in place" in box.program("node")["reason"]
                    and box.program("node"), "the node held back")
    assert sha2[:16] in node["reason"]
    box.wait_ticks(5)
    assert [r["version"] for r in box.invocations("node")] == ["v2"]  # v1 never ran
    assert box.running("node") == []
    assert box.status()["node"]["sha256"] == sha2
    path2.write_bytes(good)  # the right file back: started again
    wait_for(lambda: len(box.invocations("node")) == 2, "v2 started again")
    assert [r["version"] for r in box.invocations("node")] == ["v2", "v2"]
    wait_for(lambda: box.program("node").get("state") == "running", "v2 running again")


def test_an_adopted_node_is_known_by_what_it_runs_not_by_its_argv_path(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    cfg = parse_config({"root": str(root), "programs": {"node": {
        "command": "{node_bin} 300"}}}, tmp_path / "a.toml")
    cfg.layout.ensure()
    sup = Supervisor(cfg, Journal(cfg.layout.agent_log))
    node = root / "releases" / "0123456789abcdef" / "node"
    node.parent.mkdir(parents=True)
    sleep = shutil.which("sleep")
    assert sleep is not None
    shutil.copy(sleep, node)
    ran = hashlib.sha256(node.read_bytes()).hexdigest()
    proc = subprocess.Popen([str(node), "300"])
    try:
        wait_for(lambda: os.readlink(f"/proc/{proc.pid}/exe") == str(node), "the copy running")
        replaced = node.with_name("node.new")
        replaced.write_bytes(b"#!/bin/sh\nexec sleep 300\n")
        replaced.chmod(0o755)
        replaced.replace(node)  # a new file at the argv path; the process still runs the old
        info = procs.identify(proc.pid)
        assert info is not None
        assert sup.switch.digest_of(info).pending  # hashed by the worker, not here
        wait_for(lambda: not sup.switch.digest_of(info).pending, "the worker's digest")
        path, sha, _ = sup.switch.digest_of(info)
        assert path == str(node)
        assert sha == ran
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
