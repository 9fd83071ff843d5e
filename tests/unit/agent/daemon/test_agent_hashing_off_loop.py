"""Hashing a release runs off the supervision loop: while a large release the pointer names is
hashed, a SIGKILLed miner is restarted as usual, and the node is not started (nor switched to
it) until its digest is known. A release still being written is hashed once it settles, not
at every tick."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess

from agentbox import PY, STANDIN, Box, node_sha16, wait_for

PADDING = 4 << 20  # a "large" release: the gate below holds only files over 1 MiB
BIG = 1 << 20

# holds the hash of any file over 1 MiB until the gate file exists, so the hash lasts as long
# as the test wants; each hash of such a file is logged (its path) to count them
GATED_HASH = f"""
import os, time
from agent.base import files
real = files._hash_in_child
def gated(fd, size):
    if size > {BIG}:
        with open(os.environ["HASH_LOG"], "a") as log:
            log.write(os.readlink(f"/proc/self/fd/{{fd}}") + "\\n")
        while not os.path.exists(os.environ["HASH_GATE"]):
            time.sleep(0.01)
    return real(fd, size)
files._hash_in_child = gated
"""


def big_release_text(version: str) -> str:
    text = f"#!{PY}\n" + STANDIN.read_text().replace('VERSION = "v1"', f'VERSION = "{version}"')
    line = "#" + "x" * 1023 + "\n"
    return text + line * (PADDING // len(line))


def write_release(box: Box, text: str) -> tuple[os.PathLike[str], str]:
    sha = hashlib.sha256(text.encode()).hexdigest()
    path = box.root / "releases" / sha[:16] / "node"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path, sha


def gated_box(box: Box, gate_open: bool) -> tuple[os.PathLike[str], os.PathLike[str]]:
    gate, log = box.tmp / "hash-gate", box.tmp / "hashes.log"
    if gate_open:
        gate.write_text("")
    box.env_extra.update(HASH_GATE=str(gate), HASH_LOG=str(log))
    return gate, log


def hashes_of(log: os.PathLike[str], path: os.PathLike[str]) -> int:
    try:
        lines = open(log).read().splitlines()
    except FileNotFoundError:
        return 0
    return sum(1 for ln in lines if ln == str(path))


def kill_and_wait_restart(box: Box, name: str) -> None:
    old = box.pid_of(name)
    assert old is not None
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: box.pid_of(name) not in (None, old),
             f"{name} restarted while the release is hashed", timeout=15)


def test_a_killed_miner_is_restarted_while_the_pointer_release_is_hashed(box: Box) -> None:
    gate, log = gated_box(box, gate_open=False)
    path1, sha1 = box.release("v1")
    box.point(path1, sha1)
    box.configure()
    box.start_agent(prelude=GATED_HASH)
    wait_for(lambda: node_sha16(box) == sha1[:16], "node v1 running")
    wait_for(lambda: box.pid_of("miner"), "miner running")
    node_pid = box.pid_of("node")
    path2, sha2 = write_release(box, big_release_text("v2"))
    box.point(path2, sha2)
    wait_for(lambda: hashes_of(log, path2) >= 1, "the agent hashing v2")
    kill_and_wait_restart(box, "miner")
    pointer = box.status()["node"]["pointer"]
    assert pointer["state"] == "hashing" and pointer["path"] == str(path2), pointer
    # not switched before v2's digest is known: v1 keeps running
    assert box.pid_of("node") == node_pid and node_sha16(box) == sha1[:16]
    gate.write_text("")  # type: ignore[attr-defined]
    wait_for(lambda: node_sha16(box) == sha2[:16], "node v2 running once its digest is known")
    wait_for(lambda: [r["version"] for r in box.invocations("node")] == ["v1", "v2"],
             "v2's start recorded, and no other")


def test_the_node_is_not_started_until_its_digest_is_known(box: Box) -> None:
    gate, log = gated_box(box, gate_open=False)
    path, sha = write_release(box, big_release_text("v1"))
    box.point(path, sha)
    box.configure()
    box.start_agent(prelude=GATED_HASH)
    wait_for(lambda: hashes_of(log, path) >= 1, "the agent hashing the release")
    wait_for(lambda: box.pid_of("miner"), "miner running")
    kill_and_wait_restart(box, "miner")
    node = box.program("node")
    assert node["state"] == "blocked" and "hash" in node["reason"], node
    assert box.invocations("node") == []
    gate.write_text("")  # type: ignore[attr-defined]
    wait_for(lambda: node_sha16(box) == sha[:16], "node running once its digest is known")


def test_a_release_still_being_written_is_hashed_once_it_settles(box: Box) -> None:
    _, log = gated_box(box, gate_open=True)
    path1, sha1 = box.release("v1")
    box.point(path1, sha1)
    box.configure()
    box.start_agent(prelude=GATED_HASH)
    wait_for(lambda: node_sha16(box) == sha1[:16], "node v1 running")
    text = big_release_text("v2")
    sha2 = hashlib.sha256(text.encode()).hexdigest()
    path2 = box.root / "releases" / sha2[:16] / "node"
    path2.parent.mkdir(parents=True)
    chunks = [text[i:i + (256 << 10)] for i in range(0, len(text), 256 << 10)]
    with open(path2, "w") as f:  # a copy in progress: a chunk per agent tick
        f.write(chunks[0])
        f.flush()
        os.chmod(path2, 0o755)
        box.point(path2, sha2)
        ticks = box.ticks()
        for chunk in chunks[1:]:
            box.wait_ticks(1)
            f.write(chunk)
            f.flush()
    assert box.ticks() - ticks >= len(chunks) - 1 >= 8
    wait_for(lambda: node_sha16(box) == sha2[:16], "node v2 running once the copy is done")
    # once when first seen, once settled (and once more at most, had it changed mid-hash)
    assert hashes_of(log, path2) <= 3, hashes_of(log, path2)


# any hash of a file over 1 MiB in the agent's own process (not the worker's child) is
# logged and held until the gate opens: a loop that hashes then cannot restart a miner
GATED_IN_PROCESS = GATED_HASH + f"""
real_fd = files._hash_fd
def in_process(fd, size):
    if size > {BIG}:
        with open(os.environ["HASH_LOG"], "a") as log:
            log.write("in-process " + os.readlink(f"/proc/self/fd/{{fd}}") + "\\n")
        while not os.path.exists(os.environ["HASH_GATE"]):
            time.sleep(0.01)
    return real_fd(fd, size)
files._hash_fd = in_process
"""


def in_process_hashes(log: os.PathLike[str]) -> list[str]:
    try:
        return [ln for ln in open(log).read().splitlines() if ln.startswith("in-process ")]
    except FileNotFoundError:
        return []


def test_a_big_node_started_by_hand_is_stopped_without_being_hashed(box: Box) -> None:
    gate, log = gated_box(box, gate_open=False)
    path1, sha1 = box.release("v1")
    box.point(path1, sha1)
    box.configure(programs=("node", "miner"))
    box.start_agent(prelude=GATED_IN_PROCESS)
    wait_for(lambda: node_sha16(box) == sha1[:16] and box.pid_of("miner"), "node and miner up")
    big_path, _ = write_release(box, big_release_text("hand"))
    hand = subprocess.Popen([str(big_path), "node", "--rpc-port", "0"],
                            start_new_session=True)
    try:
        wait_for(lambda: hand.poll() is not None, "the hand-started node stopped", timeout=30)
        kill_and_wait_restart(box, "miner")
        assert in_process_hashes(log) == []
        assert node_sha16(box) == sha1[:16]
    finally:
        if hand.poll() is None:
            hand.kill()
        hand.wait()


def test_a_running_node_is_adopted_only_once_its_digest_is_known(box: Box) -> None:
    gate, log = gated_box(box, gate_open=True)
    path, sha = write_release(box, big_release_text("v1"))
    box.point(path, sha)
    box.configure(programs=("node", "miner"))
    agent = box.start_agent(prelude=GATED_IN_PROCESS)
    wait_for(lambda: node_sha16(box) == sha[:16] and box.pid_of("miner"), "node and miner up")
    node_pid = box.pid_of("node")
    box.kill_agent(agent)
    gate.unlink()  # type: ignore[attr-defined]
    box.start_agent(prelude=GATED_IN_PROCESS)  # a new agent: no digest known yet
    wait_for(lambda: "waiting for the sha256" in (box.program("node").get("reason") or ""),
             "the node neither adopted nor stopped while its digest is hashed")
    kill_and_wait_restart(box, "miner")
    assert in_process_hashes(log) == []
    assert [p.pid for p in box.running("node")] == [node_pid]
    gate.write_text("")  # type: ignore[attr-defined]
    wait_for(lambda: node_sha16(box) == sha[:16], "the node adopted once its digest is known")
    assert box.pid_of("node") == node_pid and [r["version"] for r in box.invocations("node")] \
        == ["v1"]
