"""Each fault the control surface injects, as both fake APIs answer it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sandbox.control_client import ControlClient
from sandbox.daemon import Sandbox
from sandbox.faults import Call, FaultBook, FaultError
from sandbox.world import World

Boot = Callable[[World], None]
DEPLOY = """mutation { podFindAndDeployOnDemand(input: { name: "f", imageName: "img",
  gpuTypeId: "NVIDIA GeForce RTX 4090", cloudType: ALL, ports: "22/tcp" }) {
  id desiredStatus runtime { ports { privatePort } } } }"""


@pytest.fixture
def control(sbx: Sandbox) -> Any:
    with ControlClient(sbx.control.url) as client:
        yield client


def first_ask(vast: httpx.Client) -> int:
    ask: int = vast.post("/api/v0/bundles/", json={"direct_port_count": {"gte": 1}}).json()[
        "offers"][0]["id"]
    return ask


def vast_create(vast: httpx.Client, ask: int, **body: Any) -> httpx.Response:
    return vast.put(f"/api/v0/asks/{ask}/", json={"image": "img", "disk": 10, **body})


def pod_state(runpod: Any, pod_id: str) -> dict[str, Any]:
    q = f'query {{ pod(input: {{podId: "{pod_id}"}}) {{ desiredStatus runtime {{ uptimeInSeconds }}'
    q += " lastStatusChange } }"
    pod: dict[str, Any] = runpod.data(q)["pod"]
    return pod


def test_fault_book_matches_targets_in_order_and_counts() -> None:
    book = FaultBook()
    book.add("rate_limit", "vast.create", count=2)
    book.add("server_error", "create")
    create = Call("vast", "create", frozenset({"create"}))
    search = Call("vast", "search", frozenset({"search"}))
    pod = Call("runpod", "podFindAndDeployOnDemand", frozenset({"create"}))
    assert book.take(search, {"rate_limit", "server_error"}) is None
    taken = book.take(pod, {"rate_limit", "server_error"})
    assert taken is not None and taken.kind == "server_error"
    assert [book.take(create, {"rate_limit"}).kind for _ in range(2)] == ["rate_limit"] * 2  # type: ignore[union-attr]
    assert book.take(create, {"rate_limit"}) is None and book.pending() == []
    with pytest.raises(FaultError):
        book.add("meteor", "*")


def test_vast_rate_limit_is_plain_text_without_retry_after(control: Any,
                                                           vast: httpx.Client) -> None:
    control.fault("rate_limit", "vast", count=2)
    for _ in range(2):
        resp = vast.get("/api/v1/instances/")
        assert resp.status_code == 429
        assert resp.text == "API requests too frequent"
        assert resp.headers["content-type"].startswith("text/plain")
        assert "retry-after" not in resp.headers
    assert vast.get("/api/v1/instances/").status_code == 200
    control.fault("rate_limit", "search", body="json")
    assert "detail" in vast.post("/api/v0/bundles/", json={}).json()
    control.fault("rate_limit", "vast.search", body="quota")
    assert vast.post("/api/v0/bundles/", json={}).json()["error"] == "search_quota_exceeded"


def test_runpod_rate_limit_assumed_shape(control: Any, runpod: Any) -> None:
    control.fault("rate_limit", "myself", retry_after=3)
    resp = runpod.post("query { myself { id } }")
    assert resp.status_code == 429 and resp.headers["retry-after"] == "3"
    assert resp.json()["errors"][0]["extensions"]["code"] == "TOO_MANY_REQUESTS"
    assert runpod.post("query { myself { id } }").status_code == 200


def test_server_errors(control: Any, vast: httpx.Client, runpod: Any) -> None:
    control.fault("server_error", "vast.list", status=503)
    assert vast.get("/api/v1/instances/").status_code == 503
    control.fault("server_error", "runpod")
    resp = runpod.post("query { gpuTypes { id } }")
    assert resp.status_code == 500 and "Something went wrong" in resp.json()["errors"][0][
        "message"]


def test_no_capacity(control: Any, vast: httpx.Client, runpod: Any) -> None:
    ask = first_ask(vast)
    control.fault("no_capacity", "create", count=2)
    resp = vast_create(vast, ask)
    assert resp.status_code == 404 and "no_such_ask" in resp.json()["msg"]
    body = runpod.post(DEPLOY).json()
    assert "no longer any instances available" in body["errors"][0]["message"]
    assert body["data"] == {"podFindAndDeployOnDemand": None}
    assert vast_create(vast, ask).status_code == 200  # the count is spent
    control.fault("no_capacity", "search", count=2)
    assert vast.post("/api/v0/bundles/", json={}).json() == {"offers": []}
    stock = runpod.data("query { gpuTypes { lowestPrice(input: {gpuCount: 1}) { stockStatus } } }")
    assert {t["lowestPrice"]["stockStatus"] for t in stock["gpuTypes"]} == {None}


def test_offer_gone_takes_the_offer(control: Any, vast: httpx.Client, runpod: Any) -> None:
    ask = first_ask(vast)
    control.fault("offer_gone", "vast.create")
    resp = vast_create(vast, ask, cancel_unavail=True)
    assert resp.status_code == 410 and resp.json()["error"] == "no_such_ask"
    ids = {o["id"] for o in vast.post("/api/v0/bundles/", json={}).json()["offers"]}
    assert ask not in ids
    control.fault("offer_gone", "podFindAndDeployOnDemand")
    assert "errors" in runpod.post(DEPLOY).json()


def test_create_timeout_applies_but_never_answers(sbx: Sandbox, control: Any,
                                                  vast: httpx.Client, runpod: Any) -> None:
    ask = first_ask(vast)
    control.fault("create_timeout", "create", count=2)
    with pytest.raises(httpx.RemoteProtocolError):
        vast_create(vast, ask, label="lost")
    with pytest.raises(httpx.RemoteProtocolError):
        runpod.post(DEPLOY)
    assert [i.label for i in sbx.world.live("vast")] == ["lost"]
    assert len(sbx.world.live("runpod")) == 1
    control.fault("create_timeout", "vast.create", delay=0.5)
    with pytest.raises(httpx.ReadTimeout):
        vast.put(f"/api/v0/asks/{first_ask(vast)}/", json={"image": "i", "label": "late"},
                 timeout=0.05)
    assert "late" in [i.label for i in sbx.world.live("vast")]


def test_host_death_is_noticed_late(sbx: Sandbox, control: Any, vast: httpx.Client,
                                    runpod: Any, backend: Any, booted: Boot) -> None:
    pod = runpod.data(DEPLOY)["podFindAndDeployOnDemand"]
    iid = vast_create(vast, first_ask(vast), label="dies").json()["new_contract"]
    booted(sbx.world)
    out = control.fault("host_death", pod["id"])
    assert out["applied"][0]["box_id"] == f"runpod-{pod['id']}"
    control.fault("host_death", "dies")
    assert sbx.world.settle(30)
    assert ("kill", f"runpod-{pod['id']}") in backend.calls
    assert ("kill", f"vast-{iid}") in backend.calls
    show = lambda: vast.get(f"/api/v0/instances/{iid}/").json()["instances"]  # noqa: E731
    before = pod_state(runpod, pod["id"])  # not noticed yet
    assert before["runtime"] is not None and "unreachable" not in before["lastStatusChange"]
    assert show()["actual_status"] == "running"
    sbx.world.advance(5.0)
    state = pod_state(runpod, pod["id"])
    assert state["desiredStatus"] == "RUNNING" and state["runtime"] is None
    assert state["lastStatusChange"].startswith("Host machine is unreachable: ")
    assert show()["actual_status"] == "unknown"
    sbx.world.advance(5.0)
    assert show()["actual_status"] == "offline"


def test_driver_drift(sbx: Sandbox, control: Any, vast: httpx.Client, backend: Any,
                      booted: Boot) -> None:
    iid = vast_create(vast, first_ask(vast), label="drifts").json()["new_contract"]
    booted(sbx.world)
    advertised = vast.get(f"/api/v0/instances/{iid}/").json()["instances"]["driver_version"]
    out = control.fault("driver_drift", str(iid))
    assert sbx.world.settle(30)
    assert out["applied"][0]["driver"] != advertised
    assert backend.gpus[f"vast-{iid}"].driver_version == out["applied"][0]["driver"]
    row = vast.get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert row["driver_version"] == advertised  # the API still advertises the old driver
    control.fault("driver_drift", "vast", driver="570.86.10")
    nid = vast_create(vast, first_ask(vast), label="born-drifted").json()["new_contract"]
    booted(sbx.world)
    spec = backend.specs[f"vast-{nid}"]
    assert spec.gpu.driver_version == "570.86.10"
    assert vast.get(f"/api/v0/instances/{nid}/").json()["instances"]["driver_version"] != (
        "570.86.10")


def test_container_restart_and_queued_instance_faults(sbx: Sandbox, control: Any,
                                                      vast: httpx.Client, runpod: Any,
                                                      backend: Any, booted: Boot) -> None:
    control.fault("container_restart", "runpod")
    pod = runpod.data(DEPLOY)["podFindAndDeployOnDemand"]
    booted(sbx.world)
    assert backend.ops(f"runpod-{pod['id']}") == ["start", "restart"]
    control.fault("preempt", "runpod")
    spot = runpod.data(DEPLOY)["podFindAndDeployOnDemand"]
    booted(sbx.world)
    assert pod_state(runpod, spot["id"])["desiredStatus"] == "EXITED"
    assert control.faults() == []


def test_low_bid_creates_a_stopped_instance(sbx: Sandbox, control: Any, vast: httpx.Client,
                                            booted: Boot) -> None:
    control.fault("low_bid", "vast.create")
    resp = vast_create(vast, first_ask(vast), price=1.0)
    assert resp.status_code == 400 and resp.json()["success"] is False
    iid = resp.json()["new_contract"]
    booted(sbx.world)
    row = vast.get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert (row["cur_state"], row["intended_status"], row["next_state"]) == ("stopped",) * 3
    assert row["is_bid"] is True
    ledger = control.ledger()
    meter = next(m for m in ledger["instances"] if m["id"] == str(iid))
    assert meter["gpu_usd_per_hour"] == 0 and meter["storage_usd_per_hour"] > 0
    real_low = vast_create(vast, first_ask(vast), price=0.001)  # below min_bid on its own
    assert real_low.json()["error"] == "insufficient_bid"


def test_preempt_vast_gives_the_stopped_triple(sbx: Sandbox, control: Any,
                                               vast: httpx.Client, booted: Boot) -> None:
    iid = vast_create(vast, first_ask(vast), label="spot", price=5.0).json()["new_contract"]
    booted(sbx.world)
    control.fault("preempt", "spot")
    row = vast.get(f"/api/v0/instances/{iid}/").json()["instances"]
    assert (row["actual_status"], row["intended_status"], row["next_state"]) == (
        "stopped", "stopped", "stopped")


def test_bad_fault_requests(control: Any) -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        control.fault("meteor", "vast")
    with pytest.raises(ValueError, match="no live instance"):
        control.fault("host_death", "no-such-box")
    assert control.fault("rate_limit", "vast", count=3)["queued"]["count"] == 3
    assert control.clear_faults() == 1
