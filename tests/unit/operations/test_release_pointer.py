"""The deploy's pointer write (operations/release.py) takes the box's switch lock, as `agent
switch` does: it never interleaves with a switch, and `only_if_absent` is decided under the
lock, on the pointer as it is then (not as the facts saw it before)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agent.base.lock import AgentLock
from agent.contract import POINTER, POINTER_DIGEST, Layout
from operations.release import POINT_SCRIPT

SHA = "a" * 64


def point(root: Path, node: str, only_if_absent: bool = False, wait_s: float = 900.0
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", POINT_SCRIPT, "pointer", str(root), node, SHA,
                           "1" if only_if_absent else "0", f"{wait_s:g}"],
                          capture_output=True, text=True, timeout=60)


def test_the_pointer_is_not_written_while_a_switch_holds_the_lock(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.run.mkdir(parents=True)
    lock = AgentLock(layout.switch_lock)
    assert lock.acquire()
    try:
        done = point(tmp_path, "/releases/b/node", wait_s=0.3)
    finally:
        lock.release()
    assert done.returncode != 0 and "switch.lock" in done.stderr
    assert not (tmp_path / POINTER).exists() and not (tmp_path / POINTER_DIGEST).exists()
    assert point(tmp_path, "/releases/b/node").returncode == 0
    assert (tmp_path / POINTER).read_text() == "/releases/b/node\n"
    assert (tmp_path / POINTER_DIGEST).read_text() == SHA + "\n"


def test_only_if_absent_is_decided_under_the_lock(tmp_path: Path) -> None:
    (tmp_path / POINTER).write_text("/releases/a/node\n")  # written after the facts were read
    done = point(tmp_path, "/releases/b/node", only_if_absent=True)
    assert done.returncode == 0 and "left alone" in done.stdout
    assert (tmp_path / POINTER).read_text() == "/releases/a/node\n"
