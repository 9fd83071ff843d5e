"""A log rotation that fails (a full disk) leaves no temporary copy behind and truncates the log
anyway, so that neither the log nor a leftover copy keeps the disk full; the standing log is
among the logs rotated."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from agentbox import Box

from agent.base.config import load_config
from agent.daemon import rotation
from agent.daemon.rotation import rotate_if_big, rotate_logs
from agent.daemon.supervisor import Supervisor


def test_a_failed_rotation_removes_its_copy_and_truncates_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "node.log"
    log.write_bytes(b"x" * 5000)

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rotation.os, "replace", full)
    lines: list[str] = []
    rotate_logs([log], 1000, 3, lines.append)
    assert not (tmp_path / ".node.log.1.tmp").exists()
    assert log.stat().st_size == 0
    assert not (tmp_path / "node.log.1").exists()
    assert len(lines) == 1 and "No space left" in lines[0] and "truncated" in lines[0]


def test_a_copy_that_fails_midway_leaves_nothing_either(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "miner.log"
    log.write_bytes(b"y" * 5000)

    def half(path: Path, tmp: Path, size: int, max_bytes: int) -> None:
        tmp.write_bytes(b"y" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rotation, "_copy_tail", half)
    rotate_logs([log], 1000, 3, lambda _: None)
    assert [p.name for p in tmp_path.iterdir()] == ["miner.log"]
    assert os.path.getsize(log) == 0


def test_rotation_keeps_only_the_tail_within_log_max_bytes(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    lines = [f"line {i:06d} ".encode() + b"x" * 50 + b"\n" for i in range(20000)]
    log.write_bytes(b"".join(lines))  # about 1.2 MB, twelve times the limit
    assert rotate_if_big(log, 100_000, keep=2)
    kept = (tmp_path / "big.log.1").read_bytes()
    assert 0 < len(kept) <= 100_000
    assert b"".join(lines).endswith(kept) and kept.startswith(b"line ")  # whole lines, the last
    assert log.stat().st_size == 0


def test_the_standing_log_is_rotated(box: Box) -> None:
    box.configure(programs=("node",))
    sup = Supervisor(load_config(box.config_path), lambda _: None)  # type: ignore[arg-type]
    assert sup.layout.standing_log in sup._log_paths()
