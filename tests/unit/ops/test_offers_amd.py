"""Offers for AMD cards, over real HTTP against the sandbox's fake APIs: Vast is searched on
AMD hosts by the role's exact amdgpu driver and ROCm lines (never CUDA); a RunPod rent of an
AMD card asks for no CUDA; the offers table shows the ROCm line where CUDA would be."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.boxes.sshkeys import ensure_key
from fleet.cli.boxes_cmd import offer_row
from fleet.core import config
from fleet.core.config import Config
from fleet.ops import offers as offers_mod
from fleet.ops import rent
from fleet.providers.factory import get_provider
from fleet.providers.http import RetryPolicy
from sandbox.daemon import Sandbox
from sandbox.frozen import frozen_sandbox

TOML = """
[fleet]
registry = "{tmp}/boxes.json"
ssh_key = "{tmp}/key"
known_hosts = "{tmp}/known_hosts"
daily_budget_usd = 1000
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node", "miner"]
admitted_driver = "580.95.05"
allowed_cuda = ["13.0"]
admitted_amdgpu = "6.12.12"
admitted_rocm = "6.4.1"
allowed_rocm = ["6.4"]
"""


@pytest.fixture
def sbx(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    with frozen_sandbox(seed=0, machines_per_provider=16) as s:
        for k, v in s.env().items():
            monkeypatch.setenv(k, v)
        yield s


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    ensure_key(tmp_path / "key")
    return config.parse(tomllib.loads(TOML.format(tmp=tmp_path)), tmp_path / "fleet.toml")


def client(name: str) -> Any:
    return get_provider(name, retry=RetryPolicy(attempts=2), sleep=lambda s: None)


def test_vast_amd_offers_are_on_the_exact_amdgpu_driver_and_an_allowed_rocm_line(
        sbx: Sandbox, cfg: Config) -> None:
    amd = [m for m in sbx.world.machines["vast"] if m.card.display == "MI300X"]
    with sbx.world.lock:  # one MI300X host on another branch, which the search must leave out
        amd[-1].driver = amd[-1].actual_driver = "6.10.5"
    found, failures = offers_mod.search(cfg.role("live"), [client("vast")], card="MI300X")
    assert not failures and found
    assert {(o.card, o.driver, o.rocm, o.cuda) for o in found} == {
        ("MI300X", "6.12.12", "6.4", None)}
    assert {o.machine_id for o in found} == {m.machine_id for m in amd[:-1]}


def recording_vast() -> tuple[Any, list[dict[str, Any]]]:
    """A Vast client, and the searches it sends (each query, as sent)."""
    vast = client("vast")
    sent: list[dict[str, Any]] = []
    real = vast.http.request

    def recording(method: str, path: str, **kw: Any) -> Any:
        if path == "/api/v0/bundles/":
            sent.append(kw["json"])
        return real(method, path, **kw)

    vast.http.request = recording
    return vast, sent


def test_vast_is_asked_for_amd_hosts_without_a_cuda_filter(sbx: Sandbox, cfg: Config) -> None:
    vast, sent = recording_vast()
    offers_mod.search(cfg.role("live"), [vast], card="RX 7900 XTX")
    q = sent[0]
    assert q["gpu_arch"] == {"eq": "amd"} and q["gpu_name"] == {"eq": "RX 7900 XTX"}
    assert q["driver_version"] == {"eq": 6012012} and q["rocm_version"] == {"in": [6.4]}
    assert "cuda_max_good" not in q


def test_an_amd_search_of_a_role_without_the_pair_finds_nothing_rentable(
        sbx: Sandbox, tmp_path: Path) -> None:
    ensure_key(tmp_path / "key")
    text = TOML.format(tmp=tmp_path).split("admitted_amdgpu")[0]
    nvidia_only = config.parse(tomllib.loads(text), tmp_path / "fleet.toml").role("live")
    found, _ = offers_mod.search(nvidia_only, [client("vast"), client("runpod")], card="MI300X")
    assert found == []


def test_a_runpod_rent_of_an_amd_card_asks_for_no_cuda(sbx: Sandbox, cfg: Config) -> None:
    runpod = client("runpod")
    role = cfg.role("live")
    found, failures = offers_mod.search(role, [runpod], card="MI300X")
    assert not failures and found and found[0].card == "MI300X"
    box = runpod.rent(found[0], rent.request_for(cfg, role, "live-amd-1", "runpod"))
    assert box.card == "MI300X"
    (inst,) = [i for i in sbx.world.instances.values() if i.label == "live-amd-1"]
    assert "allowedCudaVersions" not in json.dumps(inst.extra)
    assert inst.machine.card.vendor == "amd"


def test_the_offers_table_shows_the_rocm_line_of_an_amd_offer(sbx: Sandbox,
                                                               cfg: Config) -> None:
    found, _ = offers_mod.search(cfg.role("live"), [client("vast")], card="MI300X")
    row = offer_row(found[0])
    assert (row["driver"], row["cuda"]) == ("6.12.12", "ROCm 6.4")


def amd_only(tmp_path: Path, allowed_rocm: bool = True) -> Any:
    ensure_key(tmp_path / "key")
    text = TOML.format(tmp=tmp_path).replace('admitted_driver = "580.95.05"\n', "")
    if not allowed_rocm:
        text = text.replace('allowed_rocm = ["6.4"]\n', "")
    return config.parse(tomllib.loads(text), tmp_path / "fleet.toml").role("live")


@pytest.mark.parametrize("card", [None, "RTX 4090"])
def test_an_amd_only_role_is_offered_no_nvidia_box(sbx: Sandbox, tmp_path: Path,
                                                   card: str | None) -> None:
    found, failures = offers_mod.search(amd_only(tmp_path), [client("vast"), client("runpod")],
                                        card=card)
    assert not failures
    assert {o.card for o in found} <= {"MI300X", "RX 7900 XTX"}
    assert found or card == "RTX 4090"


def test_an_amd_only_role_searched_without_a_card_asks_vast_for_amd_hosts(
        sbx: Sandbox, tmp_path: Path) -> None:
    vast, sent = recording_vast()
    offers_mod.search(amd_only(tmp_path, allowed_rocm=False), [vast])
    assert sent[0]["gpu_arch"] == {"eq": "amd"} and sent[0]["rocm_version"] == {"in": [6.4]}


def test_an_offer_of_a_card_the_table_does_not_know_is_dropped_for_gpu_work(
        cfg: Config) -> None:
    from fleet.providers.base import Offer

    def offer(card: str) -> Offer:
        return Offer(provider="runpod", offer_id=card, card=card, gpu_count=1, usd_per_hour=1.0)

    kept = offers_mod.admissible(cfg.role("live"), [offer("AMD Instinct MI325X"),
                                                    offer("RTX 4090"), offer("MI300X")])
    assert [o.card for o in kept] == ["RTX 4090", "MI300X"]
