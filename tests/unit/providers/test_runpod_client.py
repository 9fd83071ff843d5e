"""RunPod GraphQL: the documents sent, the answers read, the errors mapped."""

from __future__ import annotations

import httpx
import pytest
from graphql.utilities import value_from_ast_untyped
from provider_fakes import FakeRunPod, gql_error, gql_request

from fleet.core.errors import AuthFailed, NoCapacity, ProviderError, RateLimited
from fleet.providers.base import Offer, RentRequest
from fleet.providers.runpod import RunPod, status_of

Fix = tuple[RunPod, FakeRunPod]


def offer(card: str = "RTX 4090", cloud: str = "SECURE", count: int = 1) -> Offer:
    return Offer("runpod", f"x:{cloud}", card, count, 0.69 * count, cloud=cloud)


REQ = RentRequest(label="live-runpod-abc123", image="img:1", disk_gb=40,
                  tcp_ports=(22, 26611), env={"PUBLIC_KEY": 'ssh-ed25519 AAA "q"'},
                  allowed_cuda=("12.8", "13.0"))


def test_offers_ask_lowest_price_per_cloud_and_price_the_whole_box(rp: Fix) -> None:
    client, fake = rp
    got = client.offers(card="RTX 4090", gpu_count=2, cuda=("12.8",), direct_ports=1)
    sent = [gql_request(r) for r in fake.requests]
    # the data centers are asked for once a Secure Cloud type is in stock (none listed here)
    assert [(k, f) for k, f, _, _ in sent] == [("query", "gpuTypes"), ("query", "dataCenters"),
                                               ("query", "gpuTypes")]
    sent = [s for s in sent if s[1] == "gpuTypes"]
    assert sent[0][2] == {"input": {"id": "NVIDIA GeForce RTX 4090"}}
    lowest = [next(s for s in root.selection_set.selections  # type: ignore[union-attr]
                   if s.name.value == "lowestPrice") for _, _, _, root in sent]
    inputs = [value_from_ast_untyped(f.arguments[0].value) for f in lowest]  # type: ignore[attr-defined]
    assert inputs[0] == {"gpuCount": 2, "secureCloud": True, "allowedCudaVersions": ["12.8"]}
    assert inputs[1] == {"gpuCount": 2, "secureCloud": False, "allowedCudaVersions": ["12.8"],
                         "supportPublicIp": True}
    assert [(o.card, o.cloud, o.gpu_count, o.usd_per_hour, o.stock, o.driver) for o in got] == [
        ("RTX 4090", "COMMUNITY", 2, 1.38, "High", None),
        ("RTX 4090", "SECURE", 2, 1.38, "High", None),
    ]


def test_a_refused_data_center_query_leaves_the_offers_unplaced(rp: Fix) -> None:
    client, fake = rp
    fake.data_centers = [{"id": "EU-RO-1", "listed": True}]
    # the Secure query passes, the per-data-center one is refused
    fake.queue("gpuTypes", ("before", None), ("before", gql_error("gpuTypes", "query too complex")))
    got = client.offers(card="RTX 4090")
    assert [(o.cloud, o.data_center) for o in got] == [("COMMUNITY", None), ("SECURE", None)]


def test_offers_drop_types_without_stock(rp: Fix) -> None:
    client, _ = rp
    got = client.offers()
    assert {o.card for o in got} == {"RTX 4090"}  # the H100 has stockStatus null


def test_rent_on_demand_input(rp: Fix) -> None:
    client, fake = rp
    box = client.rent(offer(), REQ)
    kind, field, args, _ = gql_request(fake.requests[-1])
    assert (kind, field) == ("mutation", "podFindAndDeployOnDemand")
    inp = args["input"]
    assert inp == {
        "name": "live-runpod-abc123", "imageName": "img:1",
        "gpuTypeId": "NVIDIA GeForce RTX 4090", "gpuCount": 1, "cloudType": "SECURE",
        "containerDiskInGb": 40, "volumeInGb": 0, "ports": "22/tcp,26611/tcp",
        "env": [{"key": "PUBLIC_KEY", "value": 'ssh-ed25519 AAA "q"'}],
        "supportPublicIp": True, "startSsh": True, "allowedCudaVersions": ["12.8", "13.0"],
    }
    query = fake.requests[-1].content.decode()
    assert "cloudType: SECURE" in query  # an enum, not a string
    assert (box.box_id, box.label, box.status, box.card) == (
        "pod0001", REQ.label, "provisioning", "RTX 4090")


def test_rent_spot_bids_per_gpu(rp: Fix) -> None:
    client, fake = rp
    req = RentRequest(label="bench-runpod-1", image="i", disk_gb=20, spot_bid=0.9,
                      onstart="echo hi", volume_gb=5)
    box = client.rent(offer(count=3, cloud="COMMUNITY"), req)
    _, field, args, _ = gql_request(fake.requests[-1])
    assert field == "podRentInterruptable"
    assert args["input"]["bidPerGpu"] == 0.3
    assert args["input"]["dockerArgs"] == "echo hi"
    assert args["input"]["volumeInGb"] == 5 and args["input"]["volumeMountPath"] == "/workspace"
    assert args["input"]["cloudType"] == "COMMUNITY"
    assert box.usd_per_hour == 0.9


def test_capacity_error_in_an_http_200_body(rp: Fix) -> None:
    client, fake = rp
    fake.queue("podFindAndDeployOnDemand", ("before", gql_error(
        "podFindAndDeployOnDemand",
        "There are no longer any instances available with the requested specifications. "
        "Please refresh and try again.")))
    with pytest.raises(NoCapacity) as e:
        client.rent(offer(), REQ)
    assert e.value.provider == "runpod" and e.value.call == "podFindAndDeployOnDemand"
    assert fake.pods == {}


def test_other_graphql_errors_are_provider_errors(rp: Fix) -> None:
    client, fake = rp
    fake.queue("myself", ("before", gql_error("myself", "Something went wrong.")))
    with pytest.raises(ProviderError) as e:
        client.boxes()
    assert type(e.value) is ProviderError and "Something went wrong" in e.value.detail


def test_bad_key_is_auth_failed(rp: Fix) -> None:
    client, fake = rp
    fake.queue("myself", ("before", httpx.Response(401, json={"error": "Unauthorized"})))
    with pytest.raises(AuthFailed) as e:
        client.boxes()
    assert "RUNPOD_API_KEY" in str(e.value)


def test_429_retried_then_rate_limited(rp: Fix) -> None:
    client, fake = rp
    fake.queue("myself", *[("before", httpx.Response(429, headers={"Retry-After": "2"}))] * 4)
    with pytest.raises(RateLimited):
        client.boxes()
    assert fake.sleeps == [2.0, 2.0, 2.0]


def test_running_pod_gives_ssh_and_p2p_endpoints(rp: Fix) -> None:
    client, fake = rp
    rented = client.rent(offer(), REQ)
    box = client.box(rented.box_id)
    assert box is not None
    assert (box.status, box.ssh_host, box.ssh_port, box.public_ip, box.p2p_public_port) == (
        "running", "203.0.113.9", 10022, "203.0.113.9", 36611)
    assert box.ports == {22: 10022, 26611: 36611} and box.ssh_ready
    assert (box.card, box.gpu_count, box.usd_per_hour) == ("RTX 4090", 1, 0.69)


def test_pod_states(rp: Fix) -> None:
    client, fake = rp
    pid = client.rent(offer(), REQ).box_id
    pod = fake.pods[pid]
    pod["runtime"] = None
    assert client.box(pid).status == "provisioning"  # type: ignore[union-attr]
    pod["runtime"] = {"ports": [{"ip": "100.65.0.1", "isIpPublic": False, "privatePort": 22,
                                 "publicPort": 1, "type": "http"}]}
    box = client.box(pid)
    assert box is not None and box.status == "provisioning" and box.ssh_host is None
    client.stop(pid)
    assert client.box(pid).status == "stopped"  # type: ignore[union-attr]
    pod["desiredStatus"] = "WEIRD"
    assert client.box(pid).status == "unknown"  # type: ignore[union-attr]


def test_an_exited_pod_carries_its_providers_words(rp: Fix) -> None:
    client, fake = rp
    pid = client.rent(offer(), REQ).box_id
    fake.pods[pid].update(desiredStatus="EXITED",
                          lastStatusChange="Exited by RunPod: container start failed")
    box = client.box(pid)
    assert box is not None and box.status == "exited"
    assert box.status_note == "Exited by RunPod: container start failed"


def test_unknown_pod_is_none(rp: Fix) -> None:
    client, fake = rp
    assert client.box("nope") is None
    fake.queue("pod", ("before", gql_error("pod", "pod not found")))
    assert client.box("nope") is None


def test_boxes_and_find_by_label(rp: Fix) -> None:
    client, fake = rp
    client.rent(offer(), REQ)
    client.rent(offer(), RentRequest(label="other", image="i", disk_gb=20))
    assert sorted(b.label for b in client.boxes()) == ["live-runpod-abc123", "other"]
    found = client.find_by_label("other")
    assert found is not None and found.label == "other"
    assert client.find_by_label("missing") is None


@pytest.mark.parametrize("desired, change, ssh, status", [
    ("RUNNING", "Rented by User: Mon Jan 05 2026", True, "running"),
    ("RUNNING", "Rented by User: Mon Jan 05 2026", False, "provisioning"),
    ("RUNNING", "Host machine is unreachable: Mon Jan 05 2026", False, "unknown"),
    ("CREATED", "", False, "provisioning"),
    ("EXITED", "Exited by User: Mon Jan 05 2026", False, "stopped"),
    ("EXITED", "Interrupted: spot instance reclaimed", False, "exited"),
    ("DEAD", "", False, "exited"),
    (None, "", False, "unknown"),
])
def test_status_of(desired: str | None, change: str, ssh: bool, status: str) -> None:
    assert status_of({"desiredStatus": desired, "lastStatusChange": change}, ssh) == status


@pytest.mark.parametrize("body", [{}, {"data": None}, {"data": {}}])
def test_an_answer_without_a_pod_is_never_read_as_no_such_pod(rp: Fix,
                                                             body: dict[str, object]) -> None:
    client, fake = rp
    pid = fake.add("live-abc123-runpod-0b0b0b")
    fake.queue("pod", ("before", httpx.Response(200, json=body)))
    with pytest.raises(ProviderError):
        client.box(pid)


def test_an_odd_listing_row_is_unreadable_and_the_others_are_read(rp: Fix) -> None:
    from fleet.providers.base import Unreadable

    client, fake = rp
    fake.add("a")
    odd = fake.add("live-abc123-runpod-0b0b0b")
    fake.pods[odd]["runtime"]["ports"][0]["publicPort"] = "soon"
    fake.add("c")
    fake.pods["garbage"] = "not a pod"  # type: ignore[assignment]
    got = client.boxes()
    assert [b.label for b in got if not isinstance(b, Unreadable)] == ["a", "c"]
    u = [b for b in got if isinstance(b, Unreadable)]
    assert [(x.provider, x.box_id, x.label) for x in u] == [
        ("runpod", odd, "live-abc123-runpod-0b0b0b"), ("runpod", None, None)]
    assert "soon" in u[0].why
    with pytest.raises(ProviderError, match="unreadable"):
        client.box(odd)
    with pytest.raises(ProviderError, match="unreadable"):
        client.find_by_label("live-abc123-runpod-0b0b0b")


def test_a_pod_this_key_is_shown_terminated_destroys_as_gone(rp: Fix) -> None:
    client, fake = rp
    pod_id = fake.add("went")
    fake.pods[pod_id]["desiredStatus"] = "TERMINATED"  # shown to this key: its account's
    fake.terminate_removes = False
    client.destroy(pod_id)  # a fresh client: the lookup before the destroy is the proof
    assert client.box(pod_id) is None


def test_a_pods_uptime_is_its_runtimes_and_a_zero_is_no_word(rp: Fix) -> None:
    """RunPod has been seen to list uptimes of 0: that is no word of a restart."""
    client, fake = rp
    pid = client.rent(offer(), REQ).box_id
    assert client.box(pid).uptime_s == 5  # type: ignore[union-attr]
    for none in (0, None, "soon", -3):
        fake.pods[pid]["runtime"]["uptimeInSeconds"] = none
        assert client.box(pid).uptime_s is None, none  # type: ignore[union-attr]
