"""Waiting for rented boxes to answer SSH: each is pinned once it does, and one its provider
reports exited is not waited for, but named in the provider's own words."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.boxes import lifecycle
from fleet.boxes.sshkeys import ensure_key
from fleet.core.boxes import Row
from fleet.core.config import Config, Role
from fleet.core.errors import FleetError
from fleet.ops import rent
from fleet.providers.base import Box
from fleet.state.registry import Registry

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIready"


class Listed:
    name = "vast"

    def __init__(self, *boxes: Box) -> None:
        self.listed = {b.box_id: b for b in boxes}

    def box(self, box_id: str) -> Box | None:
        return self.listed.get(box_id)


def setup(tmp_path: Path, *boxes: Box) -> tuple[Config, Registry, dict[str, Listed]]:
    cfg = Config(path=tmp_path / "fleet.toml", registry=tmp_path / "boxes.json",
                 known_hosts=tmp_path / "known_hosts", ssh_key=ensure_key(tmp_path / "key"),
                 releases=tmp_path / "releases", daily_budget_usd=100.0,
                 roles={"bench": Role("bench", "oneshot", "img", 20)}, roster=())
    reg = Registry(cfg.registry)
    for b in boxes:
        reg.add(Row(label=b.label, provider="vast", role="bench", kind="oneshot",
                    card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="provisioning",
                    provider_id=b.box_id))
    return cfg, reg, {"vast": Listed(*boxes)}


def box(box_id: str, status: str, note: str | None = None) -> Box:
    return Box("vast", box_id, f"bench-{box_id}", "RTX 4090", 1, 0.3, status,
               ssh_host="10.0.0.1" if status == "running" else None,
               ssh_port=22 if status == "running" else None, status_note=note)


@pytest.fixture(autouse=True)
def answers_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda *_a, **_k: KEY)


def test_a_box_its_provider_reports_exited_is_named_in_its_words_and_the_others_pinned(
        tmp_path: Path) -> None:
    note = "container start failed: sshd.log: Missing privilege separation directory\nmore"
    cfg, reg, providers = setup(tmp_path, box("1", "exited", note), box("2", "running"))
    with pytest.raises(FleetError) as refused:
        rent.wait_ready(cfg, reg, providers, ["bench-1", "bench-2"], timeout_s=600)  # at once
    said = str(refused.value)
    assert said == ("bench-1: vast reports box 1 exited before SSH answered: container start "
                    "failed: sshd.log: Missing privilege separation directory | more")
    assert reg.get("bench-2").host_key == KEY  # type: ignore[union-attr]
    assert KEY in cfg.known_hosts.read_text()


def test_a_stopped_spot_bid_is_waited_for_as_any_box_not_yet_up(tmp_path: Path) -> None:
    cfg, reg, providers = setup(tmp_path, box("1", "stopped", "bid below the current minimum"),
                                box("2", "exited", "Interrupted"))
    with pytest.raises(FleetError) as late:
        rent.wait_ready(cfg, reg, providers, ["bench-1", "bench-2"], timeout_s=0.2,
                        poll_s=0.05)
    assert str(late.value) == ("not SSH-ready after 0s: bench-1; bench-2: vast reports box 2 "
                               "exited before SSH answered: Interrupted")
