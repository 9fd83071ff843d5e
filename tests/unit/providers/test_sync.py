"""What both providers list against the registry (`fleet.providers.sync`), through the real
clients on their fakes: one odd listing row is unreadable, never gone and never an orphan,
and every other box and provider is read as usual."""

from __future__ import annotations

from pathlib import Path

from provider_fakes import FakeRunPod, FakeVast, make_http

from fleet.core.boxes import Row
from fleet.providers.runpod import RunPod
from fleet.providers.sync import view
from fleet.providers.vast import Vast
from fleet.state.registry import Registry


def row(label: str, provider: str, box_id: str) -> Row:
    return Row(label=label, provider=provider, role="live", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=0.4, status="running", provider_id=box_id)


def test_an_unreadable_listing_row_is_unsure_and_the_rest_is_read(tmp_path: Path) -> None:
    vast_fake, rp_fake = FakeVast(), FakeRunPod()
    ps = {"vast": Vast(make_http("vast", vast_fake)),
          "runpod": RunPod(make_http("runpod", rp_fake))}
    reg = Registry(tmp_path / "boxes.json")
    no_host_port = {"22/tcp": [{"HostIp": "0.0.0.0"}]}  # a bind without HostPort
    odd = str(vast_fake.add("live-vast-aaaaaa", ports=no_host_port))
    well = str(vast_fake.add("live-vast-bbbbbb"))
    pod = rp_fake.add("live-runpod-cccccc")
    stranger = str(vast_fake.add(f"live-{reg.fleet_id()}-vast-0b0b0b", ports=no_host_port))
    for label, provider, box_id in (("live-vast-aaaaaa", "vast", odd),
                                    ("live-vast-bbbbbb", "vast", well),
                                    ("live-runpod-cccccc", "runpod", pod)):
        reg.add(row(label, provider, box_id))
    v = view(reg, ps)
    assert sorted(r.label for r, _ in v.matched) == ["live-runpod-cccccc", "live-vast-bbbbbb"]
    assert list(v.unsure) == ["live-vast-aaaaaa"] and "HostPort" in v.unsure["live-vast-aaaaaa"]
    assert not v.gone and not v.orphans and not v.failures
    assert sorted(u.box_id or "" for u in v.unreadable) == sorted([odd, stranger])
