"""The control surface: world inspection, bulk rent, clock, config, keys, settle."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from sandbox.control_client import ControlClient
from sandbox.daemon import Sandbox


@pytest.fixture
def control(sbx: Sandbox) -> Iterator[ControlClient]:
    with ControlClient(sbx.control.url) as client:
        yield client


def test_health_and_machines(control: ControlClient) -> None:
    health = control.health()
    assert health["ok"] is True and health["seed"] == 7
    # 16 NVIDIA machines each, then the AMD ones
    assert health["machines"] == {"runpod": 18, "vast": 20}
    machines = control.machines()
    assert len(machines) == 38 and len({m["public_ip"] for m in machines}) == 38
    assert Counter(m["vendor"] for m in machines) == {"nvidia": 32, "amd": 6}
    first = machines[0]
    assert first["driver"] == first["actual_driver"] and first["gpus"][0]["uuid"].startswith("GPU-")


def test_bulk_rent_boot_and_host_keys(sbx: Sandbox, control: ControlClient) -> None:
    made = control.create_instances("vast", 5, label_prefix="bench", tcp_ports=[22, 26611])
    assert [m["label"] for m in made] == [f"bench-{i:04d}" for i in range(5)]
    assert {m["phase"] for m in made} == {"provisioning"}
    control.advance(1.0)
    assert control.settle()
    rows = control.instances()
    assert {r["phase"] for r in rows} == {"running"}
    assert all(r["ssh_port"] and r["ports"]["26611"] for r in rows)
    keys = control.host_keys()
    assert sorted(keys) == sorted(r["box_id"] for r in rows)
    assert all(k.startswith("ssh-ed25519 ") for k in keys.values())


def test_ledger_over_the_control_surface(sbx: Sandbox, control: ControlClient) -> None:
    control.create_instances("runpod", 2)
    control.advance(1.0)
    assert control.settle()
    control.advance(3600)
    ledger = control.ledger()
    assert len(ledger["instances"]) == 2 and ledger["total_usd"] > 0
    assert ledger["usd_per_hour"] == pytest.approx(sum(
        m["gpu_usd_per_hour"] + m["storage_usd_per_hour"] for m in ledger["instances"]))
    assert "events" in ledger and "events" not in control.ledger(events=False)


def test_config_clock_and_keys(sbx: Sandbox, control: ControlClient) -> None:
    assert control.config(boot_delay=0.01, notice_delay=2) == {"boot_delay": 0.01,
                                                               "notice_delay": 2.0}
    before = control.health()["now"]
    assert control.advance(60) == pytest.approx(before + 60)
    assert control.add_ssh_key("ssh-ed25519 AAAA op") == {"runpod": 1, "vast": 1}
    assert control.add_ssh_key("ssh-ed25519 AAAA v", provider="vast") == {"vast": 2}


def test_control_refusals(sbx: Sandbox, control: ControlClient) -> None:
    with pytest.raises(ValueError, match="provider"):
        control.create_instances("aws", 1)
    with pytest.raises(ValueError, match="only 0 of"):
        control.create_instances("vast", 1, gpu_count=64)
    with httpx.Client(base_url=sbx.control.url) as raw:
        assert raw.get("/nope").status_code == 404
        assert raw.post("/faults", content=b"[1]").status_code == 400
        assert raw.post("/faults", content=b"{").status_code == 400
