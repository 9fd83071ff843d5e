"""RunPod's GraphQL API (`POST $RUNPOD_API_BASE_URL/graphql`), served from a graphql-core schema.

The schema is SDL for the subset fleet and the runpod SDK use: `gpuTypes` with `lowestPrice`,
`myself { pods }`, `pod(input: {podId})`, `podFindAndDeployOnDemand`, `podRentInterruptable`,
`podStop`, `podResume`, `podBidResume`, `podTerminate`, `updateUserSettings`. Queries may use
inline literals (as the SDKs do) or variables. As RunPod does, business errors come back as
HTTP 200 with `errors[{message, path, extensions: {code: "RUNPOD"}}]` and `data.<field>: null`;
a malformed or schema-invalid document is HTTP 400; a bad key is 401. The API never shows a
driver: placement honours CUDA filters only, so admission after boot stays the guard.

Beside GraphQL it serves one route of RunPod's REST v2 host (rest.runpod.io): the per-pod bill,
`GET /v2/billing/pods` (`RunpodApp.billing`), from the world's ledger, `world.billing_delay`
seconds behind (RunPod bills every five minutes).
"""

from __future__ import annotations

import json
import shlex
import time
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from graphql import (
    DocumentNode,
    GraphQLError,
    OperationDefinitionNode,
    build_schema,
    execute_sync,
    parse,
    validate,
)
from graphql.language import FieldNode

from sandbox.catalog import ALL_CARDS, CARDS_BY_RUNPOD_ID, Card, Machine
from sandbox.faults import REQUEST_KINDS, Call, Fault
from sandbox.httpbase import Request, Response, json_response
from sandbox.world import Instance, World, WorldError

_POD_INPUT = """
  name: String, imageName: String, gpuTypeId: String, gpuTypeIdList: [String],
  gpuCount: Int, cloudType: CloudTypeEnum, dataCenterId: String, countryCode: String,
  minVcpuCount: Int, minMemoryInGb: Int, minDisk: Int, minDownload: Int, minUpload: Int,
  containerDiskInGb: Int, volumeInGb: Int, volumeMountPath: String, networkVolumeId: String,
  ports: String, supportPublicIp: Boolean, startSsh: Boolean, startJupyter: Boolean,
  dockerArgs: String, env: [EnvironmentVariableInput], templateId: String,
  containerRegistryAuthId: String, cudaVersion: String, minCudaVersion: String,
  allowedCudaVersions: [String], deployCost: Float, stopAfter: String, terminateAfter: String,
  volumeKey: String, instanceId: String, globalNetwork: Boolean
"""

SDL = f"""
scalar Void
enum CloudTypeEnum {{ SECURE COMMUNITY ALL }}
enum PodStatus {{ CREATED RUNNING RESTARTING EXITED PAUSED DEAD TERMINATED }}
enum PodType {{ INTERRUPTABLE RESERVED BID BACKGROUND }}

type Query {{
  myself: User
  pod(input: PodFilter!): Pod
  gpuTypes(input: GpuTypeFilter): [GpuType!]
  dataCenters: [DataCenter]
}}

type Mutation {{
  podFindAndDeployOnDemand(input: PodFindAndDeployOnDemandInput): Pod
  podRentInterruptable(input: PodRentInterruptableInput!): Pod
  podStop(input: PodStopInput!): Pod
  podResume(input: PodResumeInput!): Pod
  podBidResume(input: PodBidResumeInput!): Pod
  podTerminate(input: PodTerminateInput!): Void
  updateUserSettings(input: UpdateUserSettingsInput!): User
}}

input PodFilter {{ podId: String! }}
input GpuTypeFilter {{ id: String, ids: [String] }}
input EnvironmentVariableInput {{ key: String!, value: String }}
input PodFindAndDeployOnDemandInput {{ {_POD_INPUT} }}
input PodRentInterruptableInput {{ {_POD_INPUT}, bidPerGpu: Float! }}
input PodStopInput {{ podId: String!, incrementVersion: Boolean }}
input PodResumeInput {{ podId: String!, gpuCount: Int, syncMachine: Boolean }}
input PodBidResumeInput {{ podId: String!, bidPerGpu: Float!, gpuCount: Int }}
input PodTerminateInput {{ podId: String! }}
input UpdateUserSettingsInput {{ pubKey: String }}
input GpuLowestPriceInput {{
  gpuCount: Int, secureCloud: Boolean, dataCenterId: String, countryCode: String,
  minDisk: Int, minMemoryInGb: Int, minVcpuCount: Int, minDownload: Int, minUpload: Int,
  supportPublicIp: Boolean, cudaVersion: String, minCudaVersion: String,
  allowedCudaVersions: [String], compliance: [String], includeAiApi: Boolean
}}

type User {{
  id: String, email: String, pubKey: String, clientBalance: Float,
  currentSpendPerHr: Float, spendLimit: Int, pods: [Pod!]!, networkVolumes: [NetworkVolume]
}}
type NetworkVolume {{ id: String, name: String, size: Int, dataCenterId: String }}

type GpuType {{
  id: String!, displayName: String, manufacturer: String, memoryInGb: Int, cudaCores: Int,
  maxGpuCount: Int, maxGpuCountSecureCloud: Int, maxGpuCountCommunityCloud: Int,
  minPodGpuCount: Int, secureCloud: Boolean, communityCloud: Boolean,
  securePrice: Float, communityPrice: Float, secureSpotPrice: Float, communitySpotPrice: Float,
  oneWeekPrice: Float, oneMonthPrice: Float, threeMonthPrice: Float, sixMonthPrice: Float,
  clusterPrice: Float, nodeGroupDatacenters: [DataCenter], countryCodes: [String],
  dataCenters: [DataCenter], lowestPrice(input: GpuLowestPriceInput): LowestPrice
}}
type DataCenter {{ id: String, name: String, listed: Boolean }}
type LowestPrice {{
  gpuName: String, gpuTypeId: String, minimumBidPrice: Float, uninterruptablePrice: Float,
  minVcpu: Float, minMemory: Float, minDisk: Float, stockStatus: String,
  availableGpuCounts: [Int], maxUnreservedGpuCount: Int, rentalPercentage: Float,
  rentedCount: Int, totalCount: Int, countryCode: String, supportPublicIp: Boolean,
  compliance: [String], minDownload: Int, minUpload: Int
}}

type Pod {{
  id: String!, name: String, imageName: String, desiredStatus: PodStatus, podType: PodType,
  costPerHr: Float, adjustedCostPerHr: Float, gpuCount: Int, vcpuCount: Float,
  memoryInGb: Float, containerDiskInGb: Int, volumeInGb: Float, volumeMountPath: String,
  env: [String], ports: String, port: Int, dockerArgs: String, dockerId: String,
  machineId: String, lastStatusChange: String, lastStartedAt: String, uptimeSeconds: Int,
  locked: Boolean, templateId: String, networkVolumeId: String, runtime: PodRuntime,
  machine: PodMachineInfo
}}
type PodRuntime {{
  uptimeInSeconds: Int, ports: [PodRuntimePorts], gpus: [PodRuntimeGpus],
  container: PodRuntimeContainer
}}
type PodRuntimePorts {{
  ip: String, isIpPublic: Boolean, privatePort: Int, publicPort: Int, type: String
}}
type PodRuntimeGpus {{ id: String, gpuUtilPercent: Int, memoryUtilPercent: Int }}
type PodRuntimeContainer {{ cpuPercent: Int, memoryPercent: Int }}
type PodMachineInfo {{
  id: String, podHostId: String, gpuDisplayName: String, gpuTypeId: String,
  dataCenterId: String, location: String, countryCode: String, secureCloud: Boolean,
  supportPublicIp: Boolean, machineSystem: MachineSystem
}}
type MachineSystem {{ cudaVersion: String, os: String, kernelVersion: String }}
"""

SCHEMA = build_schema(SDL)

NO_INSTANCES = ("There are no longer any instances available with the requested "
                "specifications. Please refresh and try again.")
NO_SPOT = ("There are no longer any instances available with the request specifications. "
           "Please try again later.")
# answered without a key
PUBLIC_FIELDS = {"gpuTypes", "dataCenters", "__typename", "__schema", "__type"}
SPOT_SHARE = 0.55  # spot price as a share of on-demand


class RunpodError(GraphQLError):
    """A refusal RunPod reports inside an HTTP-200 body."""

    def __init__(self, message: str) -> None:
        super().__init__(message, extensions={"code": "RUNPOD"})


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _cloud_ok(m: Machine, cloud: str) -> bool:
    return cloud == "ALL" or m.datacenter == (cloud == "SECURE")


def eligible(m: Machine, card: Card, q: dict[str, Any], cloud: str, gpus: int) -> bool:
    """Whether `m` can take a pod of `gpus` x `card` under RunPod's filters `q`."""
    share = gpus / m.gpu_count
    min_cuda = q.get("minCudaVersion") or q.get("cudaVersion")
    return (
        m.card is card and m.free_gpus >= gpus and _cloud_ok(m, cloud)
        and (not q.get("dataCenterId") or (m.datacenter and m.location == q["dataCenterId"]))
        and (not q.get("countryCode") or m.country == q["countryCode"])
        and (not q.get("supportPublicIp") or m.direct_port_count > 0)
        and (not q.get("allowedCudaVersions") or m.cuda in q["allowedCudaVersions"])
        and (not min_cuda or (bool(m.cuda) and _version(m.cuda) >= _version(min_cuda)))
        and (q.get("minVcpuCount") or 0) <= m.cpu_cores * share
        and (q.get("minMemoryInGb") or 0) <= m.ram_gb * share
        and (q.get("minDisk") or 0) <= m.disk_gb
    )


def catalog_price(card: Card, secure: bool) -> float:
    return card.secure_price if secure else card.community_price


def spot_price(card: Card, secure: bool) -> float:
    return round(catalog_price(card, secure) * SPOT_SHARE, 3)


def lowest_price(world: World, card: Card, q: dict[str, Any], sold_out: bool) -> dict[str, Any]:
    """Price and stock for `card` under the filters `q`; `sold_out` is the no_capacity fault."""
    gpus = q.get("gpuCount") or 1
    secure = q.get("secureCloud")
    cloud = "ALL" if secure is None else ("SECURE" if secure else "COMMUNITY")
    scope = [m for m in world.machines["runpod"] if m.card is card and _cloud_ok(m, cloud)]
    fits = [] if sold_out else [m for m in scope if eligible(m, card, q, cloud, gpus)]
    total = sum(m.gpu_count for m in scope)
    free = sum(m.free_gpus for m in scope)
    stock = None if not fits else "Low" if len(fits) == 1 else "Medium" if len(fits) < 5 \
        else "High"
    best_secure = all(m.datacenter for m in fits) if fits else bool(secure)
    max_free = max((m.free_gpus for m in fits), default=0)
    return {
        "gpuName": card.display, "gpuTypeId": card.runpod_id,
        "uninterruptablePrice": catalog_price(card, best_secure),
        "minimumBidPrice": spot_price(card, best_secure),
        "minVcpu": 8.0 * gpus, "minMemory": 32.0 * gpus, "minDisk": 10.0,
        "stockStatus": stock, "availableGpuCounts": list(range(1, max_free + 1)),
        "maxUnreservedGpuCount": max_free, "totalCount": total, "rentedCount": total - free,
        "rentalPercentage": round((total - free) / total, 4) if total else 0.0,
        "countryCode": q.get("countryCode"), "supportPublicIp": any(
            m.direct_port_count > 0 for m in fits), "compliance": [],
    }


def gpu_type(world: World, card: Card, sold_out: bool = False) -> dict[str, Any]:
    machines = [m for m in world.machines["runpod"] if m.card is card]

    def most(secure: bool | None) -> int:
        return max((m.gpu_count for m in machines if secure in (None, m.datacenter)), default=0)

    centres = sorted({m.location for m in machines if m.datacenter})
    return {
        "id": card.runpod_id, "displayName": card.display,
        "manufacturer": "AMD" if card.vendor == "amd" else "Nvidia",
        "memoryInGb": card.memory_gb, "cudaCores": 0, "maxGpuCount": most(None),
        "maxGpuCountSecureCloud": most(True), "maxGpuCountCommunityCloud": most(False),
        "minPodGpuCount": 1, "secureCloud": any(m.datacenter for m in machines),
        "communityCloud": any(not m.datacenter for m in machines),
        "securePrice": card.secure_price, "communityPrice": card.community_price,
        "secureSpotPrice": spot_price(card, True), "communitySpotPrice": spot_price(card, False),
        "oneWeekPrice": round(card.secure_price * 0.95, 3),
        "oneMonthPrice": round(card.secure_price * 0.9, 3),
        "threeMonthPrice": round(card.secure_price * 0.85, 3),
        "sixMonthPrice": round(card.secure_price * 0.8, 3), "clusterPrice": None,
        "countryCodes": sorted({m.country for m in machines}),
        "dataCenters": [{"id": c, "name": c, "listed": True} for c in centres],
        "nodeGroupDatacenters": [{"id": c, "name": c, "listed": True} for c in centres],
        "lowestPrice": lambda _info, input=None: lowest_price(world, card, input or {}, sold_out),
    }


def _js_date(t: float) -> str:
    return time.strftime("%a %b %d %Y %H:%M:%S GMT+0000 (Coordinated Universal Time)",
                          time.gmtime(t))


def last_status_change(world: World, inst: Instance) -> str:
    """RunPod's free-text status line; a dead host shows only once it has been noticed."""
    dead_at = inst.machine.dead_at
    if world.host_noticed(inst):
        lost = world.now() if dead_at is None else dead_at + world.notice_delay
        return f"Host machine is unreachable: {_js_date(lost)}"
    return f"{inst.reason}: {_js_date(inst.changed_at)}"


def pod_view(world: World, inst: Instance) -> dict[str, Any]:
    m = inst.machine
    ep = inst.endpoints
    show_runtime = inst.phase == "running" and ep is not None and not world.host_noticed(inst)
    runtime = None
    if show_runtime and ep is not None:
        ports = []
        for p in inst.tcp_ports:
            if p in inst.extra.get("tcp_requested", ()) and m.direct_port_count and p in ep.ports:
                ports.append({"ip": ep.public_ip, "isIpPublic": True, "privatePort": p,
                              "publicPort": ep.ports[p], "type": "tcp"})
        for i, p in enumerate(inst.http_ports):
            ports.append({"ip": f"100.65.{m.index % 250}.{10 + i}", "isIpPublic": False,
                          "privatePort": p, "publicPort": 60000 + p % 5000, "type": "http"})
        runtime = {
            "uptimeInSeconds": int(world.now() - (inst.started_at or world.now())),
            "ports": ports,
            "gpus": [{"id": m.gpus[i].uuid, "gpuUtilPercent": 0, "memoryUtilPercent": 0}
                     for i in inst.gpu_indices],
            "container": {"cpuPercent": 0, "memoryPercent": 1},
        }
    status = "RUNNING" if inst.phase in ("provisioning", "running", "scheduling") else "EXITED"
    share = inst.gpu_count / m.gpu_count
    return {
        "id": inst.id, "name": inst.label, "imageName": inst.image, "desiredStatus": status,
        "podType": "INTERRUPTABLE" if inst.spot else "RESERVED",
        "costPerHr": round(inst.gpu_rate, 4), "adjustedCostPerHr": round(inst.gpu_rate, 4),
        "gpuCount": inst.gpu_count, "vcpuCount": float(m.cpu_cores * share),
        "memoryInGb": float(m.ram_gb * share), "containerDiskInGb": int(inst.disk_gb),
        "volumeInGb": inst.volume_gb, "volumeMountPath": inst.extra.get("volumeMountPath"),
        "env": [f"{k}={v}" for k, v in inst.env.items()], "ports": inst.extra.get("ports"),
        "port": None, "dockerArgs": inst.extra.get("dockerArgs") or "", "dockerId": None,
        "machineId": m.machine_id,
        "lastStatusChange": last_status_change(world, inst),
        "lastStartedAt": _js_date(inst.started_at) if inst.started_at else None,
        "uptimeSeconds": runtime["uptimeInSeconds"] if runtime else 0, "locked": False,
        "templateId": inst.extra.get("templateId"),
        "networkVolumeId": inst.extra.get("networkVolumeId"), "runtime": runtime,
        "machine": {
            "id": m.machine_id, "podHostId": f"{inst.id}-{m.host_id}",
            "gpuDisplayName": m.card.display, "gpuTypeId": m.card.runpod_id,
            "dataCenterId": m.location if m.datacenter else None, "location": m.country,
            "countryCode": m.country, "secureCloud": m.datacenter,
            "supportPublicIp": m.direct_port_count > 0,
            "machineSystem": {"cudaVersion": m.cuda or None, "os": "Ubuntu 22.04",
                              "kernelVersion": "6.8.0-sandbox"},
        },
    }


def parse_ports(text: str | None) -> tuple[list[int], list[int]]:
    """RunPod's `ports` string ("22/tcp,8888/http") -> (tcp ports, http ports)."""
    tcp: list[int] = []
    http: list[int] = []
    for item in (text or "").replace(" ", "").split(","):
        if not item:
            continue
        number, _, kind = item.partition("/")
        (http if kind == "http" else tcp).append(int(number))
    return tcp, http


# What RunPod's images run at container start when dockerArgs leaves their command alone:
# /start.sh, which starts sshd (the box's init does that here), runs /post_start.sh if present,
# and stays. The sandbox's image layer has one (sandbox/boxes/backend.py, IMAGE_START_SH).
IMAGE_START = "exec /start.sh"


def start_hook(docker_args: str | None) -> str | None:
    """The start command a pod's dockerArgs asks for: plain text, or dstack's JSON form;
    without dockerArgs, the image's own start script (IMAGE_START)."""
    if not docker_args:
        return IMAGE_START
    try:
        spec = json.loads(docker_args)
    except ValueError:
        return docker_args
    if isinstance(spec, dict):
        return shlex.join([*spec.get("entrypoint", []), *spec.get("cmd", [])]) or None
    return docker_args


class Root:
    """Root value for Query and Mutation; graphql-core calls these by field name."""

    def __init__(self, world: World, faults: dict[str, Fault], account: int) -> None:
        self.world = world
        self.faults = faults
        self.account = account  # the key's: its pods are the only ones it sees
        self.after: Fault | None = None  # a create_timeout to apply to the HTTP answer

    # -- queries ---------------------------------------------------------------------------

    def myself(self, _info: Any) -> dict[str, Any]:
        pods = [pod_view(self.world, i) for i in self.world.live("runpod", self.account)]
        return {
            "id": "user_sandbox" + ("" if self.account == 1 else f"_{self.account}"),
            "email": "sandbox@invalid",
            "pubKey": "\n".join(self.world.ssh_keys["runpod"]), "clientBalance": 1000.0,
            "currentSpendPerHr": round(sum(p["costPerHr"] for p in pods), 4), "spendLimit": 80,
            "pods": pods, "networkVolumes": [],
        }

    def pod(self, _info: Any, input: dict[str, Any]) -> dict[str, Any] | None:
        inst = self.world.get("runpod", input["podId"], self.account)
        return pod_view(self.world, inst) if inst is not None else None

    def dataCenters(self, _info: Any) -> list[dict[str, Any]]:
        centres = sorted({m.location for m in self.world.machines["runpod"] if m.datacenter})
        return [{"id": c, "name": c, "listed": True} for c in centres]

    def gpuTypes(self, _info: Any, input: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        wanted = set((input or {}).get("ids") or []) | {(input or {}).get("id")} - {None}
        sold_out = "gpuTypes" in self.faults  # no_capacity: every stockStatus reads null
        return [gpu_type(self.world, c, sold_out) for c in ALL_CARDS
                if not wanted or c.runpod_id in wanted]

    # -- mutations -------------------------------------------------------------------------

    def podFindAndDeployOnDemand(self, info: Any, input: dict[str, Any] | None = None) -> Any:
        return self._deploy(info.field_name, input or {}, spot=False)

    def podRentInterruptable(self, info: Any, input: dict[str, Any]) -> Any:
        return self._deploy(info.field_name, input, spot=True)

    def _deploy(self, field: str, q: dict[str, Any], spot: bool) -> dict[str, Any]:
        fault = self.faults.get(field)
        refusal = NO_SPOT if spot else NO_INSTANCES
        if not q.get("imageName"):
            raise RunpodError("imageName is required")
        type_ids = [q["gpuTypeId"]] if q.get("gpuTypeId") else list(q.get("gpuTypeIdList") or [])
        cards = [CARDS_BY_RUNPOD_ID[t] for t in type_ids if t in CARDS_BY_RUNPOD_ID]
        if not cards:
            raise RunpodError("Invalid GPU type")
        gpus = q.get("gpuCount") or 1
        cloud = q.get("cloudType") or "ALL"
        if fault is not None and fault.kind == "no_capacity":
            raise RunpodError(refusal)
        for card in cards:
            fits = [m for m in self.world.machines["runpod"] if eligible(m, card, q, cloud, gpus)]
            if fits:
                break
        else:
            raise RunpodError(refusal)
        machine = self.world.pick(fits)
        if fault is not None and fault.kind == "offer_gone":
            self.world.take_capacity(machine, machine.free_gpus)
            raise RunpodError(refusal)
        price = catalog_price(card, machine.datacenter)
        if spot and q["bidPerGpu"] < spot_price(card, machine.datacenter):
            raise RunpodError(refusal)
        tcp, http = parse_ports(q.get("ports"))
        inst = self.world.create(
            "runpod", machine, gpus, image=q["imageName"], label=q.get("name") or "",
            env={e["key"]: e.get("value") or "" for e in q.get("env") or []},
            tcp_ports=tcp, disk_gb=float(q.get("containerDiskInGb") or 10),
            volume_gb=float(q.get("volumeInGb") or 0),
            gpu_rate=(q["bidPerGpu"] if spot else price) * gpus, spot=spot,
            bid=q.get("bidPerGpu"), http_ports=http, start_hook=start_hook(q.get("dockerArgs")),
            account=self.account,
            extra={"ports": q.get("ports"), "tcp_requested": tcp,
                   "dockerArgs": q.get("dockerArgs"), "templateId": q.get("templateId"),
                   "networkVolumeId": q.get("networkVolumeId"),
                   "volumeMountPath": q.get("volumeMountPath") or "/runpod-volume"},
        )
        if fault is not None and fault.kind == "create_timeout":
            self.after = fault
        return pod_view(self.world, inst)

    def _pod(self, pod_id: str, verb: str) -> Instance:
        inst = self.world.get("runpod", pod_id, self.account)
        if inst is None:
            raise RunpodError(f"pod not found to {verb}")
        return inst

    def podStop(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        inst = self._pod(input["podId"], "stop")
        self.world.stop(inst)
        return pod_view(self.world, inst)

    def podResume(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        inst = self._pod(input["podId"], "resume")
        try:
            self.world.resume(inst)
        except WorldError as exc:
            raise RunpodError(exc.message) from exc
        return pod_view(self.world, inst)

    def podBidResume(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        inst = self._pod(input["podId"], "resume")
        inst.bid = input["bidPerGpu"]
        inst.gpu_rate = input["bidPerGpu"] * inst.gpu_count
        return self.podResume(info, input)

    def podTerminate(self, _info: Any, input: dict[str, Any]) -> None:
        self.world.destroy(self._pod(input["podId"], "terminate"))

    def updateUserSettings(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        keys = [k for k in (input.get("pubKey") or "").splitlines() if k.strip()]
        self.world.ssh_keys["runpod"][:] = keys
        return self.myself(_info)


def _errors(message: str, code: str) -> dict[str, Any]:
    return {"errors": [{"message": message, "extensions": {"code": code}}]}


@lru_cache(maxsize=256)
def _checked(query: str) -> tuple[DocumentNode, tuple[GraphQLError, ...]]:
    """A query parsed and validated against the schema, once per text: a client sends the
    same few queries again and again (validation is most of what a call costs here)."""
    document = parse(query)
    return document, tuple(validate(SCHEMA, document))


class RunpodApp:
    """`POST /graphql` over a `World`. `key` opens the world's first RunPod account; each key
    the world has for RunPod (`World.add_account`) opens its own, and only its own pods."""

    def __init__(self, world: World, key: str) -> None:
        self.world = world
        self.key = world.add_account("runpod", key)

    def __call__(self, req: Request) -> Response:
        if req.path.rstrip("/") == "/v2/billing/pods" and req.method == "GET":
            return self.billing(req)  # REST v2 (rest.runpod.io), served here beside GraphQL
        if req.path.rstrip("/") != "/graphql" or req.method != "POST":
            return json_response(404, {"message": "Not Found"})
        try:
            payload = req.json()
            document, problems = _checked(str(payload["query"]))
        except (ValueError, KeyError, TypeError, GraphQLError) as exc:
            return json_response(400, _errors(f"invalid GraphQL request: {exc}",
                                              "GRAPHQL_PARSE_FAILED"))
        if problems:
            return json_response(400, {"errors": [e.formatted for e in problems]})
        fields = _root_fields(document, payload.get("operationName"))
        key = req.bearer()
        account = self.world.account("runpod", key)
        if account is None and (key is not None or not set(fields) <= PUBLIC_FIELDS):
            # v2's problem+json body; the GraphQL 401 body is not documented
            detail = "missing bearer token" if key is None else "invalid bearer token"
            return json_response(401, {"title": "Unauthorized", "status": 401, "detail": detail})
        faults: dict[str, Fault] = {}
        for name in fields:
            creates = name in ("podFindAndDeployOnDemand", "podRentInterruptable")
            call = Call("runpod", name, _ALIASES.get(name, frozenset()))
            kinds = REQUEST_KINDS - {"low_bid"} if creates else (
                {"rate_limit", "server_error", "no_capacity"} if name == "gpuTypes"
                else {"rate_limit", "server_error"})
            fault = self.world.faults.take(call, kinds)
            if fault is not None and fault.kind == "rate_limit":
                # ASSUMED shape: RunPod does not document GraphQL rate limiting; this mirrors
                # its REST v2 429 (Retry-After in seconds) with a GraphQL errors body.
                retry = str(fault.params.get("retry_after", 1))
                body = _errors("Too many requests. Please slow down.", "TOO_MANY_REQUESTS")
                return json_response(429, body, {"Retry-After": retry})
            if fault is not None and fault.kind == "server_error":
                return json_response(int(fault.params.get("status", 500)), _errors(
                    "Something went wrong. Please try again later or contact support.",
                    "INTERNAL_SERVER_ERROR"))
            if fault is not None:
                faults[name] = fault
        with self.world.lock:
            self.world.tick()
            root = Root(self.world, faults, account or 0)  # 0: no account, no pods
            result = execute_sync(SCHEMA, document, root_value=root,
                                  variable_values=payload.get("variables") or None,
                                  operation_name=payload.get("operationName"))
        resp = json_response(200, result.formatted)
        if root.after is not None:  # create_timeout: applied, but the answer never arrives
            resp.delay = float(root.after.params.get("delay", 0))
            resp.drop = resp.delay == 0
        return resp


    def billing(self, req: Request) -> Response:
        """REST v2 `GET /v2/billing/pods?startTime&endTime[&bucketSize][&podId]` (see
        `billing_records`). Its call name for faults is `runpod.billing` (alias `charges`):
        `server_error` answers its status (500), `rate_limit` 429 with Retry-After."""
        account = self.world.account("runpod", req.bearer())
        if account is None:
            return _problem(401, "Unauthorized", "invalid bearer token")
        fault = self.world.faults.take(Call("runpod", "billing", frozenset({"charges"})),
                                       {"rate_limit", "server_error"})
        if fault is not None and fault.kind == "rate_limit":
            retry = str(fault.params.get("retry_after", 1))
            return _problem(429, "Too Many Requests", "rate limit exceeded",
                            {"Retry-After": retry})
        if fault is not None:
            return _problem(int(fault.params.get("status", 500)), "Internal Server Error",
                            "something went wrong")
        try:
            start = _parse_time(req.query["startTime"])
            end = _parse_time(req.query["endTime"])
        except (KeyError, ValueError):
            return _problem(400, "Bad Request", "startTime and endTime (RFC 3339) are required")
        bucket = req.query.get("bucketSize") or "day"
        if bucket not in BUCKETS:
            return _problem(400, "Bad Request", f"bucketSize must be one of: {', '.join(BUCKETS)}")
        if end <= start:
            return _problem(400, "Bad Request", "endTime must be after startTime")
        if (end - start) / BUCKETS[bucket] > MAX_BUCKETS:
            return _problem(400, "Bad Request", f"at most {MAX_BUCKETS} buckets per request")
        with self.world.lock:
            self.world.tick()
            records = billing_records(self.world, start, end, BUCKETS[bucket],
                                      req.query.get("podId") or None, account)
        totals = {k: round(sum(r[k] for r in records), 6)
                  for k in ("totalAmount", "gpuAmount", "cpuAmount", "diskAmount")}
        return json_response(200, {"records": records, "metadata": {
            "recordCount": len(records), "uniquePodCount": len({r["podId"] for r in records}),
            "totals": totals}})


BUCKETS = {"hour": 3600.0, "day": 86400.0}
MAX_BUCKETS = 24 * 62  # an answer's bound (ASSUMED: RunPod does not document one)


def billing_records(world: World, start: float, end: float, size: float,
                    pod_id: str | None, account: int) -> list[dict[str, Any]]:
    """One record per bucket and `account`'s pod charged in it, as `GET /v2/billing/pods`
    lists them.

    `start` is snapped down to its bucket's start (as RunPod does) and `end` is exclusive;
    a bucket's record says the bucket's bounds and counts what the pod was charged inside
    them up to `end`. Only time older than `world.billing_delay` is billed (RunPod bills
    every 5 minutes): the pod's latest minutes show up in a later answer. USD to 6 places;
    CPU is part of a GPU pod's price here, so `cpuAmount` is 0."""
    billed_to = world.now() - world.billing_delay
    records = []
    t = start - start % size  # unix time is UTC: day buckets start at UTC midnight
    while t < end:
        for c in world.charges(t, min(t + size, end), billed_to, "runpod", account):
            if pod_id not in (None, c["id"]):
                continue
            records.append({
                "startTime": _rfc3339(t), "endTime": _rfc3339(t + size), "podId": c["id"],
                "gpuAmount": round(c["gpu_usd"], 6), "cpuAmount": 0.0,
                "diskAmount": round(c["storage_usd"], 6),
                "totalAmount": round(c["gpu_usd"] + c["storage_usd"], 6)})
        t += size
    records.sort(key=lambda r: (r["startTime"], r["podId"]))
    return records


def _problem(status: int, title: str, detail: str,
             headers: dict[str, str] | None = None) -> Response:
    """RunPod REST v2's error body (problem+json)."""
    return json_response(status, {"title": title, "status": status, "detail": detail}, headers)


def _parse_time(text: str) -> float:
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


_ALIASES: dict[str, frozenset[str]] = {
    "gpuTypes": frozenset({"search"}),
    "podFindAndDeployOnDemand": frozenset({"create"}),
    "podRentInterruptable": frozenset({"create"}),
    "myself": frozenset({"list"}),
    "pod": frozenset({"show"}),
    "podStop": frozenset({"stop"}),
    "podResume": frozenset({"start"}),
    "podBidResume": frozenset({"start"}),
    "podTerminate": frozenset({"destroy"}),
}


def _root_fields(document: Any, operation_name: str | None) -> list[str]:
    ops = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    op = next((o for o in ops if o.name and o.name.value == operation_name), ops[0])
    return [s.name.value for s in op.selection_set.selections if isinstance(s, FieldNode)]
