"""Vast's REST routes and shapes, spoken over HTTP as fleet's client speaks them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sandbox.catalog import driver_number
from sandbox.daemon import Sandbox
from sandbox.world import World

Boot = Callable[[World], None]


def offers(vast: httpx.Client, **q: Any) -> list[dict[str, Any]]:
    resp = vast.post("/api/v0/bundles/", json=q)
    assert resp.status_code == 200, resp.text
    rows: list[dict[str, Any]] = resp.json()["offers"]
    return rows


def create(vast: httpx.Client, ask_id: int, **body: Any) -> httpx.Response:
    payload = {"client_id": "me", "image": "ubuntu:22.04", "disk": 20, "label": "box",
               "runtype": "ssh_direc ssh_proxy", **body}
    return vast.put(f"/api/v0/asks/{ask_id}/", json=payload)


def show(vast: httpx.Client, instance_id: int) -> dict[str, Any] | None:
    resp = vast.get(f"/api/v0/instances/{instance_id}/", params={"owner": "me"})
    assert resp.status_code == 200
    row: dict[str, Any] | None = resp.json()["instances"]
    return row


def rent(vast: httpx.Client, **body: Any) -> int:
    ask = offers(vast, direct_port_count={"gte": 2}, num_gpus={"eq": 1})[0]
    resp = create(vast, ask["id"], **body)
    assert resp.status_code == 200, resp.text
    return int(resp.json()["new_contract"])


def test_auth_bearer_query_key_and_401_shape(sbx: Sandbox, vast: httpx.Client) -> None:
    with httpx.Client(base_url=sbx.vast.url) as anon:
        assert anon.post("/api/v0/bundles/", json={}).status_code == 200  # search is public
        resp = anon.get("/api/v1/instances/")
        assert resp.status_code == 401
        assert resp.json() == {"success": False, "error": "auth_error", "msg": "Invalid user key"}
        bad = anon.get("/api/v1/instances/", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401
        ok = anon.get("/api/v1/instances/", params={"api_key": sbx.keys.vast})
        assert ok.status_code == 200


def test_offers_have_the_full_record(vast: httpx.Client, sbx: Sandbox) -> None:
    rows = offers(vast)
    fields = {"id", "ask_contract_id", "machine_id", "host_id", "num_gpus", "gpu_name", "gpu_ram",
              "cuda_max_good", "driver_version", "driver_vers", "direct_port_count", "dph_base",
              "dph_total", "min_bid", "storage_cost", "storage_total_cost", "reliability",
              "reliability2", "geolocation", "hosting_type", "verification", "public_ipaddr",
              "rentable", "rented", "search", "instance", "cpu_cores", "disk_space", "score"}
    for row in rows:
        assert fields <= set(row)
        assert row["driver_vers"] == driver_number(row["driver_version"])
        assert row["dph_total"] == pytest.approx(row["dph_base"] + row["storage_total_cost"])
        assert row["public_ipaddr"].startswith("10.77.1.")
    free = sum(m.free_gpus for m in sbx.world.machines["vast"])
    assert sum(r["num_gpus"] for r in rows if r["num_gpus"] == 1) == sum(
        1 for m in sbx.world.machines["vast"] if m.free_gpus)  # one 1-GPU offer per machine
    assert max(r["num_gpus"] for r in rows) <= free


@pytest.mark.parametrize("value", [580095005, "580095005", "580.95.05"])
def test_driver_filter_accepts_the_cli_encoding(vast: httpx.Client, value: Any) -> None:
    rows = offers(vast, driver_version={"eq": value})
    assert rows and {r["driver_version"] for r in rows} == {"580.95.05"}
    others = offers(vast, driver_version={"neq": value})
    assert others and "580.95.05" not in {r["driver_version"] for r in others}


def test_operators_virtual_columns_order_limit(vast: httpx.Client) -> None:
    every = offers(vast)
    assert all(r["direct_port_count"] >= 100 for r in offers(vast, direct_port_count={"gte": 100}))
    assert {r["gpu_name"] for r in offers(vast, gpu_name={"in": ["RTX 4090", "H100 SXM"]})} <= {
        "RTX 4090", "H100 SXM"}
    assert all(r["num_gpus"] == 1 for r in offers(vast, num_gpus={"eq": "1"}))  # CLI sends text
    us = offers(vast, geolocation={"eq": "US"})
    assert us and all(r["geolocation"].endswith("US") for r in us)
    assert all(r["hosting_type"] == 1 for r in offers(vast, datacenter={"eq": True}))
    assert len(offers(vast, verified={"eq": True}, rentable={"eq": True}, rented={"eq": False},
                      external={"eq": False})) == len(every)
    assert all(r["reliability2"] >= 0.95 for r in offers(vast, reliability2={"gte": 0.95}))
    cheap = offers(vast, order=[["dph_total", "asc"]], limit=3)
    assert len(cheap) == 3
    assert [r["dph_total"] for r in cheap] == sorted(r["dph_total"] for r in every)[:3]
    assert [r["score"] for r in every] == sorted((r["score"] for r in every), reverse=True)


def test_storage_and_bid_pricing(vast: httpx.Client) -> None:
    small = {r["id"]: r for r in offers(vast, allocated_storage=5)}
    big = {r["id"]: r for r in offers(vast, allocated_storage=100)}
    oid = next(iter(big))
    assert big[oid]["storage_total_cost"] == pytest.approx(0.15 * 100 / 720)
    assert big[oid]["dph_total"] > small[oid]["dph_total"]
    bid = {r["id"]: r for r in offers(vast, type="bid")}
    assert bid[oid]["dph_base"] == bid[oid]["min_bid"] < small[oid]["dph_base"]
    asks = vast.put("/api/v0/search/asks/", json={"select_cols": ["*"], "q": {"limit": 2}})
    assert len(asks.json()["offers"]) == 2


def test_unknown_search_field_is_refused(vast: httpx.Client) -> None:
    resp = vast.post("/api/v0/bundles/", json={"driver": {"eq": "580.95.05"}})
    assert resp.status_code == 400
    assert resp.json()["success"] is False and "driver" in resp.json()["msg"]


def test_create_show_running_ports(sbx: Sandbox, vast: httpx.Client, booted: Boot) -> None:
    iid = rent(vast, env={"-p 26611:26611": "1", "FOO": "bar"}, onstart="echo hi")
    row = show(vast, iid)
    assert row is not None
    assert row["actual_status"] is None and row["intended_status"] == "running"
    assert row["ports"] == {} and row["ssh_host"] is None
    assert row["extra_env"] == [["-p 26611:26611", "1"], ["FOO", "bar"]]
    sbx.world.tick()  # the boot is due; the backend start is submitted
    sbx.world.advance(1.0)
    booted(sbx.world)
    row = show(vast, iid)
    assert row is not None
    assert row["actual_status"] == "running" and row["cur_state"] == "running"
    assert set(row["ports"]) == {"22/tcp", "26611/tcp"}
    host_port = row["ports"]["22/tcp"][0]["HostPort"]
    assert isinstance(host_port, str) and int(host_port) == row["ssh_port"]
    assert row["public_ipaddr"].strip() == row["ssh_host"]
    assert row["onstart"] == "echo hi" and row["image_runtype"] == "ssh_direc ssh_proxy"
    assert row["driver_version"] and row["gpu_name"] and row["num_gpus"] == 1


def test_loading_while_the_backend_starts(sbx: Sandbox, vast: httpx.Client, backend) -> None:
    iid = rent(vast)
    backend.hold.clear()
    sbx.world.advance(1.0)
    row = show(vast, iid)  # the API answers while start is blocked
    assert row is not None and row["actual_status"] == "loading"
    backend.hold.set()


def test_proxy_only_without_direct_ports(sbx: Sandbox, vast: httpx.Client, booted: Boot) -> None:
    ask = offers(vast, direct_port_count={"eq": 0})[0]
    iid = int(create(vast, ask["id"]).json()["new_contract"])
    booted(sbx.world)
    row = show(vast, iid)
    assert row is not None and row["actual_status"] == "running"
    assert row["ports"] == {} and row["ssh_port"]


def test_create_refusals(sbx: Sandbox, vast: httpx.Client) -> None:
    missing = create(vast, 99_999_999)
    assert missing.status_code == 404
    assert "no_such_ask" in missing.json()["msg"] and missing.json()["error"] == "invalid_args"
    gone = create(vast, 99_999_999, cancel_unavail=True)
    assert gone.status_code == 410 and gone.json()["error"] == "no_such_ask"
    ask = offers(vast)[0]["id"]
    assert create(vast, ask, image="").status_code == 400
    assert create(vast, ask, disk=4).status_code == 400
    assert create(vast, ask, price=500).json()["error"] == "invalid_price"


def test_taken_offer_disappears(vast: httpx.Client) -> None:
    ask = offers(vast, num_gpus={"eq": 1})[0]["id"]
    assert create(vast, ask).status_code == 200
    ids = {r["id"] for r in offers(vast)}
    if ask in ids:  # a machine with GPUs left keeps offering one
        assert create(vast, ask).status_code == 200
    again = [create(vast, ask) for _ in range(8)]
    assert again[-1].status_code == 404


def test_env_as_docker_flags(sbx: Sandbox, vast: httpx.Client) -> None:
    iid = rent(vast, env="-e A=1 -e B='two words' -p 8080:8080")
    inst = sbx.world.get("vast", str(iid))
    assert inst is not None
    assert inst.env == {"A": "1", "B": "two words"} and inst.tcp_ports == [22, 8080]


def test_v1_list_pages_filters_and_label_counts(sbx: Sandbox, vast: httpx.Client) -> None:
    sbx.world.create_many("vast", 12, label_prefix="a")
    sbx.world.create_many("vast", 3, label_prefix="b")
    for inst in sbx.world.live("vast")[:5]:
        inst.label = "same"
    seen: list[int] = []
    params: dict[str, str] = {"limit": "4", "order_by": json.dumps([{"col": "id", "dir": "desc"}])}
    pages = 0
    while True:
        body = vast.get("/api/v1/instances/", params=params).json()
        pages += 1
        assert body["success"] is True and body["total_instances"] == 15
        assert body["instances_found"] == len(body["instances"]) <= 4
        seen += [r["id"] for r in body["instances"]]
        if not body["next_token"]:
            break
        params["after_token"] = body["next_token"]
    assert pages == 4 and seen == sorted(seen, reverse=True) and len(set(seen)) == 15
    assert body["label_counts"]["same"] == 5
    capped = vast.get("/api/v1/instances/", params={"limit": "100"}).json()
    assert len(capped["instances"]) == 15  # under the cap of 25
    only = vast.get("/api/v1/instances/", params={
        "select_filters": json.dumps({"label": {"eq": "same"}})}).json()
    assert [r["label"] for r in only["instances"]] == ["same"] * 5
    bad = vast.get("/api/v1/instances/",
                   params={"select_filters": json.dumps({"dph_total": {"lt": 1}})})
    assert bad.status_code == 400 and "not a valid search key" in bad.json()["msg"]


def test_v1_caps_pages_at_25(sbx: Sandbox, vast: httpx.Client) -> None:
    sbx.world.create_many("vast", 16)
    first = vast.get("/api/v1/instances/", params={"limit": "25"}).json()
    assert len(first["instances"]) == 16 and first["next_token"] is None


def test_v0_list_is_deprecated(vast: httpx.Client) -> None:
    resp = vast.get("/api/v0/instances/")
    assert resp.status_code == 410
    assert resp.json()["error"] == "deprecated_endpoint"
    assert "Use /api/v1/instances/ instead." in resp.json()["msg"]


def test_label_stop_start_destroy(sbx: Sandbox, vast: httpx.Client, booted: Boot) -> None:
    iid = rent(vast)
    booted(sbx.world)
    resp = vast.put(f"/api/v0/instances/{iid}/", json={"label": "renamed"})
    assert resp.json() == {"success": True, "msg": f"label for {iid} set to 'renamed'"}
    assert vast.put(f"/api/v0/instances/{iid}/", json={"label": "x" * 1025}).status_code == 400
    assert vast.put(f"/api/v0/instances/{iid}/", json={"state": "stopped"}).json() == {
        "success": True}
    row = show(vast, iid)
    assert row is not None and row["label"] == "renamed"
    assert (row["actual_status"], row["intended_status"], row["ports"]) == ("stopped", "stopped",
                                                                            {})
    vast.put(f"/api/v0/instances/{iid}/", json={"state": "running"})
    booted(sbx.world)
    row = show(vast, iid)
    assert row is not None and row["actual_status"] == "running"
    assert vast.put(f"/api/v0/instances/reboot/{iid}/", json={}).json()["success"] is True
    assert vast.delete(f"/api/v0/instances/{iid}/").json()["success"] is True
    assert show(vast, iid) is None
    again = vast.delete(f"/api/v0/instances/{iid}/")
    assert again.status_code == 404 and again.json()["error"] == "no_such_instance"
    assert vast.put(f"/api/v0/instances/{iid}/", json={"state": "stopped"}).status_code == 404


def test_bulk_state_and_destroy(sbx: Sandbox, vast: httpx.Client) -> None:
    ids = [int(i.id) for i in sbx.world.create_many("vast", 3)]
    assert vast.put("/api/v0/instances/", json={"ids": ids, "state": "stopped"}).status_code == 200
    assert {sbx.world.get("vast", str(i)).phase for i in ids} == {"stopped"}  # type: ignore
    resp = vast.request("DELETE", "/api/v0/instances/", json={"instance_ids": ids})
    assert resp.json()["destroyed"] == ids and sbx.world.live("vast") == []


def test_ssh_keys_and_user(sbx: Sandbox, vast: httpx.Client) -> None:
    assert vast.post("/api/v0/ssh/", json={"ssh_key": "ssh-ed25519 AAAA k"}).status_code == 200
    assert [k["public_key"] for k in vast.get("/api/v0/ssh/").json()] == ["ssh-ed25519 AAAA k"]
    assert sbx.world.ssh_keys["vast"] == ["ssh-ed25519 AAAA k"]
    assert vast.get("/api/v0/users/current/").json()["id"] == 1


def test_unknown_route(vast: httpx.Client) -> None:
    assert vast.get("/api/v0/nothing/").status_code == 404
