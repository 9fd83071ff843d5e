"""`agent switch` hashes each file once per change while it waits: its read-backs every
POLL_S share one digest cache (keyed by the file's identity), so a node and a pointer target
that stay the same are not hashed again at every poll."""

from __future__ import annotations

import pytest
from agentbox import Box, start_with, wait_for

from agent.base import files
from agent.base.config import load_config
from agent.commands import readback as readback_module
from agent.commands import switch


def test_switch_hashes_each_file_once_while_it_waits(box: Box,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    box.set_node_state(synced=False)  # never healthy: the command waits to its deadline
    path, sha = start_with(box, "v1", programs=("node",))
    wait_for(lambda: box.status()["node"]["pointer"]["state"] == "applied", "pointer applied")
    cfg = load_config(box.config_path)
    hashed: list[int] = []
    polls: list[int] = []
    real_hash, real_readback = files._hash_fd, readback_module.readback

    def counting_hash(fd: int, size: int) -> str:
        hashed.append(size)
        return real_hash(fd, size)

    def counting_readback(*args: object, **kw: object) -> object:
        polls.append(1)
        return real_readback(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(files, "_hash_fd", counting_hash)
    monkeypatch.setattr(switch, "readback", counting_readback)
    report, _ = switch.switch(cfg, str(path), sha, stable_s=1.0, deadline_s=1.5)
    assert report["outcome"] == "failed"  # already pointed, never synced: nothing to revert
    assert len(polls) >= 4
    # the node's script is the pointer's target: one file, hashed once for the whole wait
    assert len(hashed) <= 2, (len(hashed), len(polls))
