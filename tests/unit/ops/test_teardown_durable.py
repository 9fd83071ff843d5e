"""The archive is made durable before the box is destroyed, and a disk that cannot keep it
keeps the box."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from fleet.core.boxes import Row
from fleet.core.config import parse
from fleet.ops import teardown
from fleet.providers import store
from fleet.state import archive
from fleet.state.registry import Registry

CONFIG = {
    "fleet": {"registry": "state/boxes.json"},
    "store": {"repo": "fleet/outputs", "archive": "state/archive"},
    "roles": {"bench": {"kind": "oneshot", "image": "img", "disk_gb": 20,
                        "admitted_driver": "580.95.05"}},
}
MANIFEST = [{"path": "r.json", "size": 2, "sha256": "0" * 64}]


class Vast:
    name = "vast"

    def __init__(self) -> None:
        self.destroyed: list[str] = []

    def destroy(self, box_id: str) -> None:
        self.destroyed.append(box_id)

    def box(self, box_id: str) -> None:
        return None


@pytest.fixture
def setup(tmp_path: Path, monkeypatch) -> tuple[Any, Registry, list[str]]:
    cfg = parse(CONFIG, tmp_path / "fleet.toml")
    reg = Registry(tmp_path / "state" / "boxes.json")
    reg.add(Row(label="bench-1", provider="vast", role="bench", kind="oneshot",
                card="RTX 4090", gpu_count=1, usd_per_hour=0.4, status="running",
                provider_id="42", job="j1", outputs="out", host_key="ssh-ed25519 AAAA"))
    steps: list[str] = []
    monkeypatch.setattr(teardown, "_remote_job", lambda *a: {
        "spec": {"outputs": "out"}, "state": {"phase": "finished", "invocations": 1}})
    monkeypatch.setattr(teardown, "_pull", lambda *a: archive.Pulled(
        tmp_path / "state/archive/bench-1/j1/outputs", 1, 2, [], MANIFEST))
    monkeypatch.setattr(store, "push", lambda *a: steps.append("push") or "c" * 40)
    monkeypatch.setattr(store, "read_back", lambda *a: steps.append("read back") or [])
    monkeypatch.setattr(teardown, "_unchanged", lambda *a: steps.append("unchanged") or [])
    return cfg, reg, steps


def test_the_archive_is_synced_after_the_read_back_and_before_the_destroy(
        setup: tuple[Any, Registry, list[str]], monkeypatch) -> None:
    cfg, reg, steps = setup
    vast = Vast()
    monkeypatch.setattr(archive, "make_durable", lambda path: steps.append(f"sync {path.name}"))
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert steps == ["push", "read back", "unchanged", "sync j1"]
    assert out.destroyed and vast.destroyed == ["42"]


def test_an_archive_that_cannot_be_synced_keeps_the_box(
        setup: tuple[Any, Registry, list[str]], monkeypatch) -> None:
    cfg, reg, _ = setup
    vast = Vast()

    def full(path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(archive, "make_durable", full)
    with pytest.raises(teardown.KeptBox, match="cannot be made durable"):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    row = reg.get("bench-1")
    assert vast.destroyed == [] and row is not None and row.live
    assert row.teardown is not None and row.teardown.startswith("kept:")
