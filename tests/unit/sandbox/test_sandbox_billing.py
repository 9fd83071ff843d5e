"""What the fake Vast charged (`GET /api/v0/charges/`), from the ledger's per-second meters,
over HTTP as Vast answers it and as fleet's client reads it; and the spent today it gives."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest
from conftest import T0
from test_sandbox_vast_api import Boot, rent

from fleet import bills
from fleet.providers import get_provider
from fleet.registry import Row
from sandbox.daemon import Sandbox
from sandbox.ledger import Ledger


def test_a_window_charges_each_rate_for_its_part_of_the_window() -> None:
    ledger = Ledger()
    ledger.set_rates("v/1", "vast", "1", "box", 0.0, "running", gpu=3.6, storage=0.36)
    ledger.set_rates("v/1", "vast", "1", "box", 100.0, "stopped", gpu=0.0, storage=0.36)
    (c,) = ledger.charges(50.0, 150.0, now=200.0)
    assert c["gpu_usd"] == pytest.approx(3.6 * 50 / 3600)  # running 50..100 only
    assert c["storage_usd"] == pytest.approx(0.36 * 100 / 3600)  # the whole window
    assert ledger.charges(300.0, 400.0, now=200.0) == []  # a window in the future: nothing


def charges(vast: httpx.Client, gte: float, lte: float, **params: str) -> httpx.Response:
    filters = {"day": {"gte": gte, "lte": lte}, "type": {"in": ["instance"]}}
    return vast.get("/api/v0/charges/", params={"select_filters": json.dumps(filters),
                                               **params})


def test_charges_answer_in_vasts_shape_clipped_to_the_day(sbx: Sandbox, vast: httpx.Client,
                                                           booted: Boot) -> None:
    iid = rent(vast, label="live-vast-aaaaaa")
    sbx.world.tick()
    booted(sbx.world)
    sbx.world.advance(3600)
    body = charges(vast, T0, T0 + 7200).json()
    assert body["success"] and body["count"] == body["total"] == 1 and body["next_token"] is None
    (row,) = body["results"]
    assert row["source"] == f"instance-{iid}" and row["type"] == "instance"
    assert row["metadata"] == {"label": "live-vast-aaaaaa"}
    assert {i["type"] for i in row["items"]} == {"gpu", "disk"}
    assert row["amount"] == pytest.approx(sum(i["amount"] for i in row["items"]), abs=0.002)
    half = charges(vast, sbx.world.now() - 1800, sbx.world.now()).json()["results"][0]
    assert half["amount"] == pytest.approx(row["amount"] / 2, rel=0.05)  # clipped to the window
    missing = vast.get("/api/v0/charges/", params={"select_filters": "{}"})
    assert missing.status_code == 400 and "day" in missing.json()["msg"]


def test_the_client_pages_through_and_bills_give_spent_today(sbx: Sandbox, vast: httpx.Client,
                                                             booted: Boot, tmp_path,
                                                             monkeypatch) -> None:
    ids = [rent(vast, label=f"live-vast-00000{n}") for n in range(3)]
    sbx.world.tick()
    booted(sbx.world)
    sbx.world.advance(7200)
    paged = charges(vast, T0, sbx.world.now(), limit="2").json()
    assert paged["count"] == 2 and paged["next_token"]
    monkeypatch.setenv("VAST_URL", sbx.vast.url)
    monkeypatch.setenv("VAST_API_KEY", sbx.keys.vast)
    client = get_provider("vast")
    now = datetime.fromtimestamp(sbx.world.now(), UTC)
    got = client.charges(datetime.fromtimestamp(T0, UTC), now)  # type: ignore[attr-defined]
    assert sorted(got) == sorted(str(i) for i in ids) and all(v > 0 for v in got.values())
    registry = tmp_path / "boxes.json"
    read = bills.refresh(registry, {"vast": client}, now)
    assert read.charges["vast"] == got and not read.errors
    rows = [Row(label=f"live-vast-00000{n}", provider="vast", role="live", kind="standing",
                card="RTX 4090", gpu_count=1, usd_per_hour=0.5, status="running",
                provider_id=str(i), created_at="2026-01-01T00:00:00Z")
            for n, i in enumerate(ids)]
    spent = bills.billed(rows, bills.load(registry), now)
    assert spent == {r.label: pytest.approx(got[r.provider_id]) for r in rows}


def test_runpods_billing_lags_five_minutes_and_the_client_reads_it(
        sbx: Sandbox, booted: Boot, monkeypatch) -> None:
    from fleet.providers.base import RentRequest

    monkeypatch.setenv("RUNPOD_API_BASE_URL", sbx.runpod.url)
    monkeypatch.setenv("RUNPOD_REST_URL", sbx.runpod.url)
    monkeypatch.setenv("RUNPOD_API_KEY", sbx.keys.runpod)
    client = get_provider("runpod")
    offer = client.offers(card="RTX 4090")[0]
    box = client.rent(offer, RentRequest(label="live-runpod-aaaaaa", image="img", disk_gb=10))
    sbx.world.tick()
    booted(sbx.world)
    start = datetime.fromtimestamp(sbx.world.now(), UTC)
    sbx.world.advance(200)  # younger than RunPod's billing cycle: nothing billed yet
    young = client.charges(start, datetime.fromtimestamp(sbx.world.now(), UTC))  # type: ignore[attr-defined]
    assert young == {}
    sbx.world.advance(3600)
    now = datetime.fromtimestamp(sbx.world.now(), UTC)
    got = client.charges(start, now)  # type: ignore[attr-defined]
    (meter,) = sbx.world.ledger.charges(start.timestamp(), now.timestamp() - 300,
                                        sbx.world.now())
    assert meter["gpu_usd"] > 0  # it ran: GPU and disk
    assert got == {box.box_id: pytest.approx(meter["gpu_usd"] + meter["storage_usd"],
                                             abs=2e-6)}
    bad = httpx.get(f"{sbx.runpod.url}/v2/billing/pods", headers={
        "Authorization": f"Bearer {sbx.keys.runpod}"})
    assert bad.status_code == 400
