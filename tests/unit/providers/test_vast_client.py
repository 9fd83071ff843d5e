"""Vast REST: search encoding, create body, paginated listing, instance parsing, errors."""

from __future__ import annotations

import json

import httpx
import pytest
from provider_fakes import FakeVast, query_of, vast_instance

from fleet.core.errors import NoCapacity, OfferGone, ProviderError, RateLimited, UsageError
from fleet.providers.base import Offer, RentRequest
from fleet.providers.vast import Vast, driver_code, status_of

Fix = tuple[Vast, FakeVast]

OFFER = Offer("vast", "501", "RTX 4090", 1, 0.41, driver="580.95.05")
REQ = RentRequest(label="live-vast-abc123", image="img:1", disk_gb=40, tcp_ports=(22, 26611),
                  env={"PUBLIC_KEY": "ssh-ed25519 AAA"}, onstart="bash /root/onstart.sh")


@pytest.mark.parametrize("driver, code", [
    ("580.95.05", 580095005), ("535.86.05", 535086005), ("570.172.08", 570172008),
])
def test_driver_code_matches_the_vastai_cli(driver: str, code: int) -> None:
    from vastai.api.query import numeric_version  # the official encoder, as reference

    assert driver_code(driver) == code == numeric_version(driver)


@pytest.mark.parametrize("bad", ["580.95", "580", "a.b.c", "580.95.05.1"])
def test_driver_code_refuses_anything_but_x_y_z(bad: str) -> None:
    with pytest.raises(UsageError):
        driver_code(bad)


def test_search_body(vast: Fix) -> None:
    client, fake = vast
    client.offers(card="RTX 4090", gpu_count=2, driver="580.95.05", direct_ports=1,
                  cuda=("13.0",))
    req = fake.requests[0]
    assert (req.method, req.url.path) == ("POST", "/api/v0/bundles/")
    assert json.loads(req.content) == {
        "verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
        "rented": {"eq": False}, "num_gpus": {"eq": 2}, "gpu_name": {"eq": "RTX 4090"},
        "driver_version": {"eq": 580095005}, "direct_port_count": {"gte": 1},
        "cuda_max_good": {"in": [13.0]}, "order": [["dph_total", "asc"]],
        "type": "on-demand", "allocated_storage": 10.0,
    }


def test_search_prices_the_disk_asked_for(vast: Fix) -> None:
    client, fake = vast
    client.offers(disk_gb=60)
    assert json.loads(fake.requests[0].content)["allocated_storage"] == 60.0


def test_offers_rechecked_for_the_exact_driver(vast: Fix) -> None:
    client, _ = vast
    got = client.offers(driver="580.95.05")  # the fake ignores filters: 580.82.07 comes back
    assert [(o.offer_id, o.driver) for o in got] == [("501", "580.95.05")]
    o = got[0]
    assert (o.card, o.gpu_count, o.usd_per_hour, o.cuda, o.cloud, o.country, o.reliability,
            o.direct_ports) == ("RTX 4090", 1, 0.41, "13.0", "datacenter", "US", 0.99, 20)
    assert len(client.offers()) == 2


def test_search_quota_is_not_retried(vast: Fix) -> None:
    client, fake = vast
    fake.queue("search", ("before", httpx.Response(429, json={"error": "search_quota_exceeded"})))
    with pytest.raises(RateLimited):
        client.offers()
    assert len(fake.requests) == 1


def test_plain_text_429_without_retry_after_is_retried_with_backoff(vast: Fix) -> None:
    client, fake = vast
    fake.queue("search", *[("before", httpx.Response(
        429, text="API requests too frequent: endpoint threshold=10"))] * 2)
    assert len(client.offers()) == 2
    assert fake.sleeps == [0.75, 1.5]


def test_create_body(vast: Fix) -> None:
    client, fake = vast
    box = client.rent(OFFER, REQ)
    put = next(r for r in fake.requests if r.method == "PUT")
    assert put.url.path == "/api/v0/asks/501/"
    assert json.loads(put.content) == {
        "client_id": "me", "image": "img:1", "disk": 40, "label": "live-vast-abc123",
        "env": {"PUBLIC_KEY": "ssh-ed25519 AAA", "-p 26611:26611": "1"},
        "runtype": "ssh_direc ssh_proxy", "cancel_unavail": True,
        "onstart": "bash /root/onstart.sh",
    }
    assert (box.box_id, box.label, box.status, box.driver) == (
        "1001", "live-vast-abc123", "provisioning", "580.95.05")


def test_spot_create_sends_the_bid(vast: Fix) -> None:
    client, fake = vast
    box = client.rent(OFFER, RentRequest(label="b1", image="i", disk_gb=10, spot_bid=0.2))
    put = next(r for r in fake.requests if r.method == "PUT")
    assert json.loads(put.content)["price"] == 0.2
    assert box.usd_per_hour == 0.2


@pytest.mark.parametrize("status, body", [
    (404, {"success": False, "error": "invalid_args",
           "msg": "error 404/3603: no_such_ask Instance type by id 501 is not available."}),
    (410, {"success": False, "error": "no_such_ask",
           "msg": "error 410/3907: no_such_ask Instance type 501 is no longer available."}),
])
def test_offer_gone(vast: Fix, status: int, body: dict[str, object]) -> None:
    client, fake = vast
    fake.queue("create", ("before", httpx.Response(status, json=body)))
    with pytest.raises(OfferGone) as e:
        client.rent(OFFER, REQ)
    assert e.value.provider == "vast" and e.value.call == "PUT /api/v0/asks/501/"
    assert "no_such_ask" in str(e.value)


def test_other_create_refusals(vast: Fix) -> None:
    client, fake = vast
    fake.queue("create", ("before", httpx.Response(400, json={
        "success": False, "error": "invalid_args", "msg": "disk must be at least 8"})))
    with pytest.raises(ProviderError) as e:
        client.rent(OFFER, REQ)
    assert type(e.value) is ProviderError and "disk must be at least 8" in e.value.detail
    assert e.value.refused  # an answer that said no: no box was made


def test_a_create_answered_without_a_contract_is_not_a_refusal(vast: Fix) -> None:
    client, fake = vast
    fake.queue("create", ("before", httpx.Response(200, json={"success": True})))
    with pytest.raises(ProviderError) as e:
        client.rent(OFFER, REQ)
    assert not e.value.refused  # nothing says whether a box was made


def test_low_bid_leftover_is_destroyed(vast: Fix) -> None:
    client, fake = vast

    def low_bid(req: httpx.Request) -> httpx.Response:
        iid = fake.add("b1", actual_status="stopped", intended_status="stopped")
        return httpx.Response(400, json={"success": False, "error": "invalid_price",
                                         "msg": "bid below the minimum", "new_contract": iid})

    fake.queue("create", ("before", low_bid))
    with pytest.raises(NoCapacity) as e:
        client.rent(OFFER, RentRequest(label="b1", image="i", disk_gb=10, spot_bid=0.01))
    assert "destroyed" in e.value.detail and "bid" in e.value.hint
    assert fake.instances == {}
    assert [r.method for r in fake.requests].count("DELETE") == 1


def test_listing_follows_next_token_25_a_page(vast: Fix) -> None:
    client, fake = vast
    for n in range(60):
        fake.add(f"box-{n}")
    boxes = client.boxes()
    assert [b.label for b in boxes] == [f"box-{n}" for n in range(60)]
    pages = [query_of(r) for r in fake.requests]
    assert [p.get("after_token") for p in pages] == [None, "25", "50"]
    assert all(p["limit"] == "25" for p in pages)
    assert json.loads(pages[0]["order_by"]) == [{"col": "id", "dir": "asc"}]
    assert json.loads(pages[0]["select_filters"]) == {}
    assert fake.requests[0].url.path == "/api/v1/instances/"


def test_a_looping_next_token_is_an_error(vast: Fix) -> None:
    client, fake = vast
    loop = httpx.Response(200, json={"instances": [], "next_token": "same"})
    fake.queue("list", ("before", loop), ("before", loop))
    with pytest.raises(ProviderError, match="loops"):
        client.boxes()


def test_find_by_label_filters_on_the_server_and_here(vast: Fix) -> None:
    client, fake = vast
    fake.add("a")
    fake.add("b")
    found = client.find_by_label("b")
    assert found is not None and found.label == "b"
    assert json.loads(query_of(fake.requests[-1])["select_filters"]) == {"label": {"eq": "b"}}
    assert client.find_by_label("zzz") is None


def test_instance_with_direct_ports() -> None:
    client = Vast.__new__(Vast)
    client.p2p_port = None
    box = client._box(vast_instance(7, "x"))
    assert (box.ssh_host, box.ssh_port, box.public_ip, box.p2p_public_port) == (
        "198.51.100.7", 20022, "198.51.100.7", 20611)
    assert box.ports == {22: 20022, 26611: 20611}
    assert (box.status, box.driver, box.card, box.usd_per_hour) == (
        "running", "580.95.05", "RTX 4090", 0.41)


def test_instance_behind_the_ssh_proxy() -> None:
    client = Vast.__new__(Vast)
    client.p2p_port = None
    box = client._box(vast_instance(7, "x", ports={}, actual_status="loading"))
    assert (box.ssh_host, box.ssh_port, box.p2p_public_port, box.status) == (
        "ssh5.vast.ai", 31007, None, "provisioning")


@pytest.mark.parametrize("fields, status", [
    ({"actual_status": None}, "provisioning"),
    ({"actual_status": "loading"}, "provisioning"),
    ({"actual_status": "scheduling"}, "provisioning"),
    ({"actual_status": "running"}, "running"),
    ({"actual_status": "stopped", "intended_status": "stopped"}, "stopped"),
    ({"actual_status": "running", "cur_state": "stopped", "intended_status": "stopped",
      "next_state": "stopped"}, "stopped"),
    ({"actual_status": "exited"}, "exited"),
    ({"actual_status": "created", "status_msg": "Error: OCI runtime create failed"}, "exited"),
    ({"actual_status": "unknown"}, "unknown"),
    ({"actual_status": "offline"}, "unknown"),
])
def test_statuses(fields: dict[str, object], status: str) -> None:
    inst = {"cur_state": "running", "intended_status": "running", "next_state": "running"}
    inst.update(fields)
    assert status_of(inst) == status


def test_show_gone_instance_is_none(vast: Fix) -> None:
    client, fake = vast
    assert client.box("999") is None
    fake.queue("show", ("before", httpx.Response(404, json={"error": "not_found"})))
    assert client.box("999") is None
    assert query_of(fake.requests[0]) == {"owner": "me"}


def test_stop_and_label(vast: Fix) -> None:
    client, fake = vast
    iid = fake.add("a")
    client.stop(str(iid))
    client.set_label(str(iid), "renamed")
    puts = [json.loads(r.content) for r in fake.requests if r.method == "PUT"]
    assert puts == [{"state": "stopped"}, {"label": "renamed"}]
    box = client.box(str(iid))
    assert box is not None and box.status == "stopped" and box.label == "renamed"


def test_a_404_that_is_not_vast_saying_gone_is_an_error(vast: Fix) -> None:
    client, fake = vast
    iid = str(fake.add("a"))
    page = httpx.Response(404, text="<html>404 Not Found</html>")
    fake.queue("show", ("before", page))
    with pytest.raises(ProviderError, match="not JSON"):
        client.box(iid)
    fake.queue("destroy", ("before", httpx.Response(404, json={"error": "no_route"})))
    with pytest.raises(ProviderError, match="no_route"):
        client.destroy(iid)
    assert client.box(iid) is not None  # nothing was taken for gone


def test_an_answer_without_an_instance_is_never_read_as_no_such_box(vast: Fix) -> None:
    client, fake = vast
    fake.instances[7] = vast_instance(7, "live-abc123-vast-0b0b0b")
    fake.queue("show", ("before", httpx.Response(
        200, json={"success": False, "error": "server_error", "msg": "try again later"})))
    with pytest.raises(ProviderError, match="try again later"):
        client.box("7")


def test_an_odd_listing_row_is_unreadable_and_the_others_are_read(vast: Fix) -> None:
    from fleet.providers.base import Unreadable

    client, fake = vast
    fake.add("a")
    odd = fake.add("live-abc123-vast-0b0b0b", ports={"22/tcp": [{"HostIp": "0.0.0.0"}]})
    fake.add("c")
    got = client.boxes()
    assert [b.label for b in got if not isinstance(b, Unreadable)] == ["a", "c"]
    (u,) = [b for b in got if isinstance(b, Unreadable)]
    assert (u.provider, u.box_id, u.label) == ("vast", str(odd), "live-abc123-vast-0b0b0b")
    assert "HostPort" in u.why
    assert u.usd_per_hour is not None and u.usd_per_hour > 0  # its price still reads
    # asked for alone, or by its label, it is the fleet's blindness: never "no such box"
    with pytest.raises(ProviderError, match="unreadable.*HostPort"):
        client.box(str(odd))
    with pytest.raises(ProviderError, match="unreadable"):
        client.find_by_label("live-abc123-vast-0b0b0b")


def test_an_unreadable_listing_row_keeps_its_price_where_that_reads() -> None:
    from fleet.providers.base import Unreadable, price

    assert [price(v) for v in ("0.39", 2, None, "nan", "inf", 0, -1, "x", True)] == \
        [0.39, 2.0, None, None, None, None, None, None, None]
    assert Unreadable("vast", "1", None, "odd").usd_per_hour is None
