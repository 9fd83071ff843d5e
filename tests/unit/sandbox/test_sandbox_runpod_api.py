"""RunPod's GraphQL: schema-executed queries, inline literals and variables, errors in 200s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sandbox.daemon import Sandbox
from sandbox.runpod_api import NO_INSTANCES, SCHEMA
from sandbox.world import World

Boot = Callable[[World], None]

POD_FIELDS = """id name imageName desiredStatus podType costPerHr gpuCount vcpuCount memoryInGb
  containerDiskInGb volumeInGb volumeMountPath env ports machineId lastStatusChange uptimeSeconds
  runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type }
            gpus { id gpuUtilPercent memoryUtilPercent } container { cpuPercent memoryPercent } }
  machine { gpuDisplayName podHostId dataCenterId location secureCloud supportPublicIp
            machineSystem { cudaVersion os kernelVersion } }"""

DEPLOY = f"""mutation Deploy($input: PodFindAndDeployOnDemandInput) {{
  podFindAndDeployOnDemand(input: $input) {{ {POD_FIELDS} }} }}"""


def deploy(runpod: Any, **fields: Any) -> dict[str, Any]:
    inp = {"name": "box", "imageName": "runpod/base:0.6.2", "gpuTypeId": "NVIDIA GeForce RTX 4090",
           "gpuCount": 1, "cloudType": "ALL", "supportPublicIp": True, "startSsh": True,
           "containerDiskInGb": 20, "volumeInGb": 10, "ports": "22/tcp,26611/tcp,8888/http",
           "env": [{"key": "ROLE", "value": "live"}], **fields}
    pod: dict[str, Any] = runpod.data(DEPLOY, {"input": inp})["podFindAndDeployOnDemand"]
    return pod


def get_pod(runpod: Any, pod_id: str) -> dict[str, Any] | None:
    pod: dict[str, Any] | None = runpod.data(
        f'query {{ pod(input: {{podId: "{pod_id}"}}) {{ {POD_FIELDS} }} }}')["pod"]
    return pod


def test_gpu_types_work_without_a_key(runpod: Any) -> None:
    resp = runpod.post("query { gpuTypes { id displayName memoryInGb securePrice } }", key=None)
    assert resp.status_code == 200
    types = resp.json()["data"]["gpuTypes"]
    assert {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80,
            "securePrice": 2.69} in types


def test_keys_bearer_query_param_and_401(sbx: Sandbox, runpod: Any) -> None:
    assert runpod.post("query { myself { id } }", key=None).status_code == 401
    bad = runpod.post("query { myself { id } }", key="wrong")
    assert bad.status_code == 401 and bad.json()["status"] == 401
    assert runpod.post("query { gpuTypes { id } }", key="wrong").status_code == 401
    ok = runpod.client.post("/graphql", params={"api_key": sbx.keys.runpod},
                            json={"query": "query { myself { id } }"})
    assert ok.status_code == 200 and ok.json()["data"]["myself"]["id"]


def test_lowest_price_reports_stock_and_prices(runpod: Any, sbx: Sandbox) -> None:
    q = """query Q($n: Int) { gpuTypes(input: {id: "NVIDIA GeForce RTX 4090"}) {
        id maxGpuCount communityPrice securePrice secureSpotPrice
        lowestPrice(input: {gpuCount: $n}) { minimumBidPrice uninterruptablePrice stockStatus
          availableGpuCounts maxUnreservedGpuCount totalCount rentedCount } } }"""
    [one] = runpod.data(q, {"n": 1})["gpuTypes"]
    assert one["lowestPrice"]["stockStatus"] in ("Low", "Medium", "High")
    assert one["lowestPrice"]["uninterruptablePrice"] in (one["communityPrice"],
                                                          one["securePrice"])
    assert one["lowestPrice"]["minimumBidPrice"] < one["lowestPrice"]["uninterruptablePrice"]
    [many] = runpod.data(q, {"n": 64})["gpuTypes"]
    assert many["lowestPrice"]["stockStatus"] is None
    total = sum(m.gpu_count for m in sbx.world.machines["runpod"]
                if m.card.runpod_id == "NVIDIA GeForce RTX 4090")
    assert one["lowestPrice"]["totalCount"] == total


def test_deploy_inline_literals_like_the_sdks(runpod: Any, sbx: Sandbox, booted: Boot) -> None:
    query = """mutation { podFindAndDeployOnDemand(input: { name: "inline", imageName: "img",
        gpuTypeId: "NVIDIA GeForce RTX 4090", cloudType: ALL, startSsh: true,
        supportPublicIp: true, dataCenterId: null, ports: "22/tcp",
        env: [{ key: "A", value: "1" }, { key: "B", value: "x=y" }] }) {
        id imageName env machineId machine { podHostId } } }"""
    pod = runpod.data(query)["podFindAndDeployOnDemand"]
    assert pod["env"] == ["A=1", "B=x=y"]
    assert pod["machine"]["podHostId"].startswith(pod["id"] + "-")
    assert len(pod["id"]) == 14 and pod["id"].isalnum()


def test_runtime_is_null_until_running_then_ports(runpod: Any, sbx: Sandbox,
                                                  booted: Boot) -> None:
    pod = deploy(runpod)
    assert pod["desiredStatus"] == "RUNNING" and pod["runtime"] is None
    assert pod["costPerHr"] > 0 and pod["podType"] == "RESERVED"
    booted(sbx.world)
    pod2 = get_pod(runpod, pod["id"])
    assert pod2 is not None
    ports = {p["privatePort"]: p for p in pod2["runtime"]["ports"]}
    assert set(ports) == {22, 26611, 8888}
    machine_ip = sbx.world.get("runpod", pod["id"]).machine.public_ip  # type: ignore[union-attr]
    assert ports[22]["ip"] == machine_ip and ports[22]["isIpPublic"] is True
    assert ports[22]["type"] == "tcp" and ports[22]["publicPort"] != 22
    assert ports[8888]["ip"].startswith("100.65.") and ports[8888]["isIpPublic"] is False
    assert ports[8888]["type"] == "http"
    assert len(pod2["runtime"]["gpus"]) == 1 and pod2["runtime"]["gpus"][0]["id"].startswith("GPU-")
    assert pod2["machine"]["machineSystem"]["cudaVersion"]
    listed = runpod.data(f"query {{ myself {{ pods {{ {POD_FIELDS} }} }} }}")["myself"]["pods"]
    assert [p["id"] for p in listed] == [pod["id"]]


def test_no_driver_anywhere_in_the_schema() -> None:
    names = {f for t in SCHEMA.type_map.values() for f in getattr(t, "fields", {}) or {}}
    assert not any("driver" in n.lower() for n in names)


def test_cuda_filters_steer_placement(runpod: Any, sbx: Sandbox) -> None:
    cudas = {m.cuda for m in sbx.world.machines["runpod"]
             if m.card.runpod_id == "NVIDIA GeForce RTX 4090"}
    for cuda in sorted(cudas):
        pod = deploy(runpod, allowedCudaVersions=[cuda])
        assert pod["machine"]["machineSystem"]["cudaVersion"] == cuda
    none = runpod.post(DEPLOY, {"input": {"imageName": "i", "gpuTypeId": "NVIDIA L40S",
                                          "minCudaVersion": "99.0"}})
    assert none.status_code == 200
    body = none.json()
    assert body["data"] == {"podFindAndDeployOnDemand": None}
    assert body["errors"][0]["message"] == NO_INSTANCES
    assert body["errors"][0]["path"] == ["podFindAndDeployOnDemand"]
    assert body["errors"][0]["extensions"] == {"code": "RUNPOD"}


def test_secure_cloud_and_datacentre(runpod: Any, sbx: Sandbox) -> None:
    secure = [m for m in sbx.world.machines["runpod"] if m.datacenter]
    target = secure[0]
    pod = deploy(runpod, gpuTypeId=target.card.runpod_id, cloudType="SECURE",
                 dataCenterId=target.location)
    assert pod["machine"]["secureCloud"] is True
    assert pod["machine"]["dataCenterId"] == target.location


def test_spot_needs_a_bid_at_least_the_minimum(runpod: Any) -> None:
    mutation = """mutation S($bid: Float!) { podRentInterruptable(input: { bidPerGpu: $bid,
        imageName: "img", gpuTypeId: "NVIDIA GeForce RTX 4090", cloudType: ALL }) {
        id podType costPerHr } }"""
    low = runpod.post(mutation, {"bid": 0.01}).json()
    assert "no longer any instances available" in low["errors"][0]["message"]
    pod = runpod.data(mutation, {"bid": 5.0})["podRentInterruptable"]
    assert pod["podType"] == "INTERRUPTABLE" and pod["costPerHr"] == 5.0


def test_stop_resume_terminate(runpod: Any, sbx: Sandbox, booted: Boot) -> None:
    pod = deploy(runpod)
    booted(sbx.world)
    pid = pod["id"]
    stopped = runpod.data(f'mutation {{ podStop(input: {{podId: "{pid}"}}) {{ id desiredStatus '
                          f'runtime {{ uptimeInSeconds }} }} }}')["podStop"]
    assert stopped == {"id": pid, "desiredStatus": "EXITED", "runtime": None}
    resumed = runpod.data(f'mutation {{ podResume(input: {{podId: "{pid}", gpuCount: 1}}) '
                          f'{{ id desiredStatus }} }}')["podResume"]
    assert resumed["desiredStatus"] == "RUNNING"
    booted(sbx.world)
    assert get_pod(runpod, pid)["runtime"] is not None  # type: ignore[index]
    done = runpod.data(f'mutation {{ podTerminate(input: {{podId: "{pid}"}}) }}')
    assert done == {"podTerminate": None}
    assert get_pod(runpod, pid) is None
    assert runpod.data("query { myself { pods { id } } }")["myself"]["pods"] == []
    again = runpod.post(f'mutation {{ podTerminate(input: {{podId: "{pid}"}}) }}').json()
    assert again["errors"][0]["message"] == "pod not found to terminate"


def test_resume_fails_when_the_gpus_are_gone(runpod: Any, sbx: Sandbox, booted: Boot) -> None:
    pod = deploy(runpod)
    booted(sbx.world)
    runpod.data(f'mutation {{ podStop(input: {{podId: "{pod["id"]}"}}) {{ id }} }}')
    inst = sbx.world.get("runpod", pod["id"])
    assert inst is not None
    sbx.world.take_capacity(inst.machine, inst.machine.gpu_count)
    resp = runpod.post(f'mutation {{ podResume(input: {{podId: "{pod["id"]}", gpuCount: 1}}) '
                       f'{{ id }} }}').json()
    assert resp["errors"][0]["message"] == (
        "There are not enough free GPUs on the host machine to start this pod.")


@pytest.mark.parametrize("query", ["query { nope }", "query {", "mutation { podStop { id } }"])
def test_invalid_documents_are_400(runpod: Any, query: str) -> None:
    resp = runpod.post(query)
    assert resp.status_code == 400 and resp.json()["errors"]


def test_user_pubkey(runpod: Any, sbx: Sandbox) -> None:
    data = runpod.data('mutation { updateUserSettings(input: {pubKey: "ssh-ed25519 A a\\n'
                       'ssh-ed25519 B b"}) { id pubKey } }')
    assert data["updateUserSettings"]["pubKey"] == "ssh-ed25519 A a\nssh-ed25519 B b"
    assert sbx.world.ssh_keys["runpod"] == ["ssh-ed25519 A a", "ssh-ed25519 B b"]


def test_other_paths_404(sbx: Sandbox) -> None:
    with httpx.Client(base_url=sbx.runpod.url) as client:
        assert client.get("/graphql").status_code == 404
        assert client.post("/v1/pods").status_code == 404
