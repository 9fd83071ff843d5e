"""The fake providers' bills: the ledger's rate segments and the windows cut from them, Vast's
`GET /api/v0/charges/` and RunPod's REST v2 `GET /v2/billing/pods` over HTTP: their shapes,
the refusals, paging, RunPod's billing delay and buckets, and their faults."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from test_sandbox_runpod_api import deploy
from test_sandbox_vast_api import rent

from sandbox.daemon import Sandbox
from sandbox.frozen import T0
from sandbox.ledger import Ledger, Segment
from sandbox.world import World

Boot = Callable[[World], None]
H = 3600.0


# -- the ledger --------------------------------------------------------------------------------


def test_each_state_change_closes_a_segment_and_opens_the_next() -> None:
    ledger = Ledger()
    ledger.set_rates("v/1", "vast", "1", "box", 0.0, "running", gpu=2.0, storage=0.1)
    ledger.set_rates("v/1", "vast", "1", "box", 10.0, "running", gpu=2.0, storage=0.1)  # same
    ledger.set_rates("v/1", "vast", "1", "box", H, "stopped", gpu=0.0, storage=0.1)
    ledger.set_rates("v/1", "vast", "1", "box", 2 * H, "destroyed", gpu=0.0, storage=0.0)
    assert ledger.segments("v/1") == [
        Segment(0.0, H, "running", 2.0, 0.1), Segment(H, 2 * H, "stopped", 0.0, 0.1),
        Segment(2 * H, None, "destroyed", 0.0, 0.0)]
    assert ledger.segments("nope") == []


def test_a_window_is_exact_and_itemised_per_kind_and_rate() -> None:
    ledger = Ledger()
    ledger.set_rates("v/1", "vast", "1", "box", 0.0, "running", gpu=2.0, storage=0.1)
    ledger.set_rates("v/1", "vast", "1", "box", H, "stopped", gpu=0.0, storage=0.1)
    ledger.set_rates("v/1", "vast", "1", "box", 2 * H, "running", gpu=3.0, storage=0.1)
    # half an hour at $2, an hour stopped, half an hour at $3; storage all along
    (c,) = ledger.charges(0.5 * H, 2.5 * H, now=10 * H)
    assert c["gpu_usd"] == pytest.approx(0.5 * 2.0 + 0.5 * 3.0)
    assert c["storage_usd"] == pytest.approx(2 * 0.1)
    assert (c["start"], c["end"]) == (0.5 * H, 2.5 * H)
    items = {(i["kind"], i["usd_per_hour"]): i["hours"] for i in c["items"]}
    assert items == {("gpu", 2.0): pytest.approx(0.5), ("gpu", 3.0): pytest.approx(0.5),
                     ("storage", 0.1): pytest.approx(2.0)}
    # the meter agrees with the windows that tile its life
    parts = [ledger.charges(a * H, (a + 0.25) * H, now=3 * H) for a in
             (0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 2.75)]
    tiled = sum(p[0]["gpu_usd"] + p[0]["storage_usd"] for p in parts if p)
    meter = ledger.meter("v/1", 3 * H)
    assert meter is not None and tiled == pytest.approx(meter["total_usd"])


def test_the_open_segment_ends_at_now_and_zero_rates_are_not_charged() -> None:
    ledger = Ledger()
    ledger.set_rates("r/a", "runpod", "a", "pod", 0.0, "provisioning", gpu=0.0, storage=0.0)
    ledger.set_rates("r/a", "runpod", "a", "pod", 100.0, "running", gpu=3.6, storage=0.0)
    ledger.set_rates("v/9", "vast", "9", "other", 0.0, "running", gpu=1.0, storage=0.0)
    (c,) = ledger.charges(0.0, 10 * H, now=200.0, provider="runpod")
    assert c["id"] == "a" and c["start"] == 100.0 and c["end"] == 200.0
    assert c["gpu_usd"] == pytest.approx(0.1)  # $3.6/h for 100 s, nothing while booting
    assert ledger.charges(300.0, 400.0, now=200.0) == []  # a window in the future
    assert ledger.charges(0.0, 50.0, now=200.0, provider="runpod") == []  # booting: free


# -- Vast: GET /api/v0/charges/ ----------------------------------------------------------------


def vast_charges(vast: httpx.Client, gte: Any, lte: Any, **params: Any) -> httpx.Response:
    filters = {"day": {"gte": gte, "lte": lte}, **params.pop("filters", {})}
    return vast.get("/api/v0/charges/", params={"select_filters": json.dumps(filters),
                                               **params})


def test_vast_charges_refuse_a_missing_or_bad_window_and_a_bad_limit(vast: httpx.Client,
                                                                      sbx: Sandbox) -> None:
    for filters in ("{}", json.dumps({"day": {"gte": T0}}), "not json"):
        r = vast.get("/api/v0/charges/", params={"select_filters": filters})
        assert r.status_code == 400 and r.json()["error"] == "invalid_args", filters
    assert vast.get("/api/v0/charges/").status_code == 400
    assert vast_charges(vast, T0 + 10, T0).status_code == 400  # lte before gte
    assert vast_charges(vast, "soon", T0).status_code == 400
    assert vast_charges(vast, T0, T0 + 1, limit="501").status_code == 400
    assert vast_charges(vast, T0, T0 + 1, limit="500").status_code == 200
    with httpx.Client(base_url=sbx.vast.url) as anon:  # the fake's auth refusal, as elsewhere
        r = anon.get("/api/v0/charges/", params={"select_filters": json.dumps(
            {"day": {"gte": T0, "lte": T0 + 1}})}, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.json()["error"] == "auth_error"


def test_vast_charges_page_by_token_and_filter_by_type(vast: httpx.Client, sbx: Sandbox,
                                                        booted: Boot) -> None:
    ids = {str(rent(vast, label=f"box-{n}")) for n in range(5)}
    booted(sbx.world)
    sbx.world.advance(H)
    now = sbx.world.now()
    seen: list[str] = []
    token = None
    for _ in range(10):  # bounded: 5 rows, 2 a page
        extra = {"after_token": token} if token else {}
        body = vast_charges(vast, T0, now, limit="2", **extra).json()
        assert body["success"] and body["total"] == 5 and body["count"] <= 2
        seen += [r["source"].removeprefix("instance-") for r in body["results"]]
        token = body["next_token"]
        if token is None:
            break
    assert sorted(seen) == sorted(ids)  # every instance once
    newest = vast_charges(vast, T0, now, latest_first="true").json()["results"]
    assert [r["start"] for r in newest] == sorted((r["start"] for r in newest), reverse=True)
    volumes = vast_charges(vast, T0, now, filters={"type": {"in": ["volume"]}}).json()
    assert volumes["total"] == 0 and volumes["results"] == []
    one_kind = vast_charges(vast, T0, now, filters={"type": {"eq": "instance"}}).json()
    assert one_kind["total"] == 5


def test_a_stopped_vast_instance_bills_its_disk_only(vast: httpx.Client, sbx: Sandbox,
                                                     booted: Boot) -> None:
    iid = rent(vast, label="box")
    booted(sbx.world)
    sbx.world.advance(H)
    assert vast.put(f"/api/v0/instances/{iid}/", json={"state": "stopped"}).status_code == 200
    t_stop = sbx.world.now()
    sbx.world.advance(H)
    (stopped,) = vast_charges(vast, t_stop, sbx.world.now()).json()["results"]
    assert [i["type"] for i in stopped["items"]] == ["disk"]
    (both,) = vast_charges(vast, T0, sbx.world.now()).json()["results"]
    assert {i["type"] for i in both["items"]} == {"gpu", "disk"}
    assert both["amount"] == pytest.approx(sum(i["amount"] for i in both["items"]), abs=0.002)
    meter = sbx.world.ledger.meter(f"vast-{iid}", sbx.world.now())
    assert meter is not None and both["amount"] == pytest.approx(meter["total_usd"], abs=0.001)


def test_vast_charges_can_be_faulted_by_name(vast: httpx.Client, sbx: Sandbox) -> None:
    sbx.world.faults.add("server_error", "vast.charges", count=1, status=503)
    sbx.world.faults.add("rate_limit", "vast.charges", count=1)
    assert vast_charges(vast, T0, T0 + 1).status_code == 503
    assert vast_charges(vast, T0, T0 + 1).status_code == 429
    assert vast_charges(vast, T0, T0 + 1).status_code == 200


# -- RunPod: GET /v2/billing/pods --------------------------------------------------------------


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def billing(sbx: Sandbox, key: str | None = "default", **params: Any) -> httpx.Response:
    headers = {} if key is None else {
        "Authorization": f"Bearer {sbx.keys.runpod if key == 'default' else key}"}
    return httpx.get(f"{sbx.runpod.url}/v2/billing/pods", params=params, headers=headers,
                     timeout=10)


def test_runpod_billing_refusals(sbx: Sandbox) -> None:
    assert billing(sbx, key=None, startTime=iso(T0), endTime=iso(T0 + H)).status_code == 401
    assert billing(sbx, key="nope", startTime=iso(T0), endTime=iso(T0 + H)).status_code == 401
    for params in ({}, {"startTime": iso(T0)}, {"startTime": "yesterday", "endTime": iso(T0)},
                   {"startTime": iso(T0 + H), "endTime": iso(T0)},
                   {"startTime": iso(T0), "endTime": iso(T0 + H), "bucketSize": "fortnight"},
                   {"startTime": iso(T0), "endTime": iso(T0 + 365 * 24 * H),
                    "bucketSize": "hour"}):
        r = billing(sbx, **params)
        assert r.status_code == 400 and r.json()["status"] == 400, params


def test_runpod_bills_only_what_is_older_than_the_billing_delay(runpod: Any, sbx: Sandbox,
                                                                 booted: Boot) -> None:
    assert sbx.world.billing_delay == 300.0  # RunPod's five-minute cycle by default
    pod = deploy(runpod, volumeInGb=0)
    booted(sbx.world)
    started = sbx.world.now()
    sbx.world.advance(200)
    window = {"startTime": iso(T0), "endTime": iso(T0 + 24 * H), "bucketSize": "day"}
    empty = billing(sbx, **window).json()
    assert empty == {"records": [], "metadata": {
        "recordCount": 0, "uniquePodCount": 0, "totals": {
            "totalAmount": 0.0, "gpuAmount": 0.0, "cpuAmount": 0.0, "diskAmount": 0.0}}}
    sbx.world.billing_delay = 10.0  # a test may shorten the cycle
    sbx.world.advance(H)
    (rec,) = billing(sbx, **window).json()["records"]
    billed_to = sbx.world.now() - 10.0
    (want,) = sbx.world.ledger.charges(T0, billed_to, billed_to, "runpod")
    assert rec["podId"] == pod["id"] and rec["cpuAmount"] == 0.0
    assert (rec["startTime"], rec["endTime"]) == (iso(T0)[:19] + "Z", iso(T0 + 24 * H)[:19] + "Z")
    assert rec["gpuAmount"] == pytest.approx(want["gpu_usd"], abs=1e-6) and rec["gpuAmount"] > 0
    assert rec["diskAmount"] == pytest.approx(want["storage_usd"], abs=1e-6)
    assert rec["totalAmount"] == pytest.approx(rec["gpuAmount"] + rec["diskAmount"], abs=2e-6)
    assert want["end"] == pytest.approx(billed_to) and want["start"] == pytest.approx(started)


def test_runpod_hour_buckets_snap_the_start_and_filter_by_pod(runpod: Any, sbx: Sandbox,
                                                               booted: Boot) -> None:
    sbx.world.billing_delay = 0.0
    a, b = deploy(runpod, name="a"), deploy(runpod, name="b")
    booted(sbx.world)
    sbx.world.advance(2.5 * H)
    now = sbx.world.now()
    body = billing(sbx, startTime=iso(T0 + 0.5 * H), endTime=iso(now), bucketSize="hour").json()
    records = body["records"]
    assert records[0]["startTime"] == iso(T0)[:19] + "Z"  # snapped down to its hour
    assert {r["podId"] for r in records} == {a["id"], b["id"]}
    assert len(records) == 6  # three hours touched, two pods each
    assert body["metadata"]["recordCount"] == 6 and body["metadata"]["uniquePodCount"] == 2
    assert body["metadata"]["totals"]["totalAmount"] == pytest.approx(
        sum(r["totalAmount"] for r in records), abs=1e-5)
    day = billing(sbx, startTime=iso(T0), endTime=iso(now), bucketSize="day").json()
    assert day["metadata"]["totals"]["totalAmount"] == pytest.approx(
        body["metadata"]["totals"]["totalAmount"], abs=1e-5)  # the same time, bucketed twice
    only_a = billing(sbx, startTime=iso(T0), endTime=iso(now), podId=a["id"]).json()
    assert [r["podId"] for r in only_a["records"]] == [a["id"]]


def test_runpod_billing_can_be_faulted_by_name(sbx: Sandbox) -> None:
    window = {"startTime": iso(T0), "endTime": iso(T0 + H)}
    sbx.world.faults.add("server_error", "runpod.billing", count=1, status=502)
    sbx.world.faults.add("rate_limit", "runpod.charges", count=1, retry_after=7)
    assert billing(sbx, **window).status_code == 502
    limited = billing(sbx, **window)
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "7"
    assert billing(sbx, **window).status_code == 200
