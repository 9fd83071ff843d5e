"""Wire-level stand-ins for the two providers, served through httpx.MockTransport.

Each fake keeps just enough state (pods, instances) to test rent and destroy, records every
request, and lets a test queue faults: a response or exception handed out instead of (or
after) the real work. Sleeping is recorded, never done.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from graphql import parse
from graphql.language import FieldNode, OperationDefinitionNode
from graphql.utilities import value_from_ast_untyped

from fleet.providers.http import Http, RetryPolicy, Secret

CANARY = "canary-KEY-7f3a9c1e5d"

# A fault: ("before", x) answers x instead of doing the call; ("after", x) does the call,
# then answers x (a create that lands but whose answer never arrives). x is an
# httpx.Response, an exception instance, a callable(request) -> Response, or None: this call
# passes untouched (so a later entry can hit the n-th call).
Fault = tuple[str, Any]


@dataclass
class Recorder:
    requests: list[httpx.Request] = field(default_factory=list)
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    sleeps: list[float] = field(default_factory=list)

    def queue(self, call: str, *faults: Fault) -> None:
        self.faults.setdefault(call, []).extend(faults)

    def take(self, call: str, when: str) -> Any:
        q = self.faults.get(call) or []
        if q and q[0][0] == when:
            return q.pop(0)[1]
        return None

    def serve(self, call: str, req: httpx.Request, work: Callable[[], httpx.Response]) -> Any:
        q = self.faults.get(call) or []
        if q and q[0] == ("before", None):
            q.pop(0)
            return work()
        before = self.take(call, "before")
        if before is not None:
            return _deliver(before, req)
        resp = work()
        after = self.take(call, "after")
        return _deliver(after, req) if after is not None else resp


def _deliver(x: Any, req: httpx.Request) -> httpx.Response:
    if isinstance(x, BaseException):
        raise x
    if callable(x):
        return x(req)
    return x


def gql_request(req: httpx.Request) -> tuple[str, str, dict[str, Any], FieldNode]:
    """(operation kind, root field, its arguments as Python values, the field node)."""
    doc = parse(json.loads(req.content)["query"])
    op = doc.definitions[0]
    assert isinstance(op, OperationDefinitionNode)
    root = op.selection_set.selections[0]
    assert isinstance(root, FieldNode)
    args = {a.name.value: value_from_ast_untyped(a.value) for a in root.arguments or ()}
    return op.operation.value, root.name.value, args, root


def gql_error(field: str, message: str) -> httpx.Response:
    return httpx.Response(200, json={
        "errors": [{"message": message, "path": [field], "extensions": {"code": "RUNPOD"}}],
        "data": {field: None},
    })


class FakeRunPod(Recorder):
    """RunPod GraphQL: gpuTypes, pod creation, myself.pods, pod, podStop, podTerminate."""

    def __init__(self) -> None:
        super().__init__()
        self.pods: dict[str, dict[str, Any]] = {}
        self.gpu_types: list[dict[str, Any]] = [
            {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24,
             "secureCloud": True, "communityCloud": True,
             "lowestPrice": {"minimumBidPrice": 0.2, "uninterruptablePrice": 0.69,
                             "stockStatus": "High", "maxUnreservedGpuCount": 8}},
            {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80,
             "secureCloud": True, "communityCloud": True,
             "lowestPrice": {"minimumBidPrice": 1.5, "uninterruptablePrice": 2.69,
                             "stockStatus": None, "maxUnreservedGpuCount": 0}},
        ]
        self.data_centers: list[dict[str, Any]] = []  # root `dataCenters`: none listed
        self.terminate_removes = True
        self._n = 0

    def __call__(self, req: httpx.Request) -> httpx.Response:
        self.requests.append(req)
        assert req.url.path == "/graphql"
        return self.serve(gql_request(req)[1], req, lambda: self.answer(req))

    def answer(self, req: httpx.Request) -> httpx.Response:
        """The fault-free answer to `req`."""
        kind, name, args, _ = gql_request(req)
        return self.handle(kind, name, args)

    def add(self, name: str, gpus: int = 1, ports: str = "22/tcp", image: str = "img") -> str:
        self._n += 1
        pod_id = f"pod{self._n:04d}"
        self.pods[pod_id] = {
            "id": pod_id, "name": name, "desiredStatus": "RUNNING",
            "costPerHr": 0.69 * gpus, "gpuCount": gpus, "imageName": image,
            "lastStatusChange": "Rented by User", "uptimeSeconds": 0, "ports": ports,
            "runtime": {"uptimeInSeconds": 5, "ports": [
                {"ip": "203.0.113.9", "isIpPublic": True, "privatePort": p,
                 "publicPort": 10000 + p, "type": "tcp"}
                for p in (int(x.split("/")[0]) for x in ports.split(","))
            ]},
            "machine": {"gpuDisplayName": "RTX 4090", "podHostId": f"{pod_id}-1"},
        }
        return pod_id

    def handle(self, kind: str, name: str, args: dict[str, Any]) -> httpx.Response:
        inp = args.get("input") or {}
        if name == "dataCenters":
            return httpx.Response(200, json={"data": {"dataCenters": self.data_centers}})
        if name == "gpuTypes":
            types = [t for t in self.gpu_types if not inp or t["id"] == inp.get("id")]
            return httpx.Response(200, json={"data": {"gpuTypes": types}})
        if name in ("podFindAndDeployOnDemand", "podRentInterruptable"):
            pod_id = self.add(inp["name"], inp["gpuCount"], inp["ports"], inp["imageName"])
            env = [f"{e['key']}={e['value']}" for e in inp.get("env", [])]
            return httpx.Response(200, json={"data": {name: {
                "id": pod_id, "imageName": inp["imageName"], "env": env,
                "machineId": "m1", "desiredStatus": "RUNNING", "machine": {"podHostId": "x"},
            }}})
        if name == "myself":
            pods = list(self.pods.values())
            return httpx.Response(200, json={"data": {"myself": {"pods": pods}}})
        if name == "pod":
            return httpx.Response(200, json={"data": {"pod": self.pods.get(inp["podId"])}})
        if name == "podStop":
            pod = self.pods[inp["podId"]]
            pod["desiredStatus"], pod["runtime"] = "EXITED", None
            pod["lastStatusChange"] = "Exited by User: Mon Jan 05 2026 10:00:00 GMT+0000"
            return httpx.Response(200, json={"data": {"podStop": {
                "id": inp["podId"], "desiredStatus": "EXITED"}}})
        if name == "podTerminate":
            if inp["podId"] not in self.pods:
                return gql_error("podTerminate", "pod not found to terminate")
            if self.terminate_removes:
                del self.pods[inp["podId"]]
            return httpx.Response(200, json={"data": {"podTerminate": None}})
        raise AssertionError(f"unexpected GraphQL field {name}")


def vast_instance(i: int, label: str, **over: Any) -> dict[str, Any]:
    inst = {
        "id": i, "label": label, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.41,
        "actual_status": "running", "cur_state": "running", "intended_status": "running",
        "next_state": "running", "driver_version": "580.95.05",
        "ssh_host": "ssh5.vast.ai", "ssh_port": 31000 + i,
        "public_ipaddr": "198.51.100.7\n ",
        "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "20022"}],
                  "26611/tcp": [{"HostIp": "0.0.0.0", "HostPort": "20611"}]},
        "extra_env": [["-p 26611:26611", "1"]],
    }
    inst.update(over)
    return inst


class FakeVast(Recorder):
    """Vast REST: bundles, asks, the v1 listing (25 a page), show, label/state, destroy."""

    def __init__(self) -> None:
        super().__init__()
        self.instances: dict[int, dict[str, Any]] = {}
        self.offers: list[dict[str, Any]] = [
            {"id": 501, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.41,
             "driver_version": "580.95.05", "driver_vers": 580095005, "cuda_max_good": 13.0,
             "hosting_type": 1, "geolocation": "Texas, US", "reliability2": 0.99,
             "direct_port_count": 20},
            {"id": 502, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.38,
             "driver_version": "580.82.07", "driver_vers": 580082007, "cuda_max_good": 13.0,
             "hosting_type": 0, "geolocation": "Quebec, CA", "reliability2": 0.97,
             "direct_port_count": 4},
        ]
        self.destroy_removes = True
        self._next = 1000

    def __call__(self, req: httpx.Request) -> httpx.Response:
        self.requests.append(req)
        return self.serve(self.call_name(req), req, lambda: self.answer(req))

    @staticmethod
    def call_name(req: httpx.Request) -> str:
        path, method = req.url.path, req.method
        if path == "/api/v0/bundles/":
            return "search"
        if path.startswith("/api/v0/asks/"):
            return "create"
        if path == "/api/v1/instances/":
            return "list"
        return {"GET": "show", "PUT": "update", "DELETE": "destroy"}[method]

    def answer(self, req: httpx.Request) -> httpx.Response:
        """The fault-free answer to `req`."""
        path, method = req.url.path, req.method
        if path == "/api/v0/bundles/" and method == "POST":
            return httpx.Response(200, json={"offers": self.offers})
        if path.startswith("/api/v0/asks/") and method == "PUT":
            return self.create(req)
        if path == "/api/v1/instances/" and method == "GET":
            return self.list(req)
        if path.startswith("/api/v0/instances/"):
            return self.one(method, int(path.rstrip("/").rsplit("/", 1)[1]), req)
        raise AssertionError(f"unexpected {method} {path}")

    def add(self, label: str, **over: Any) -> int:
        self._next += 1
        self.instances[self._next] = vast_instance(self._next, label, **over)
        return self._next

    def create(self, req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content)
        iid = self.add(body["label"], actual_status=None, ports={})
        return httpx.Response(200, json={"success": True, "new_contract": iid,
                                         "instance_api_key": "inst-key"})

    def list(self, req: httpx.Request) -> httpx.Response:
        q = {k: v[0] for k, v in parse_qs(req.url.query.decode()).items()}
        filters = json.loads(q.get("select_filters", "{}"))
        rows = sorted(self.instances.values(), key=lambda r: r["id"])
        if "label" in filters:
            rows = [r for r in rows if r["label"] == filters["label"]["eq"]]
        start = int(q.get("after_token", "0"))
        limit = int(q.get("limit", "25"))
        page = rows[start:start + limit]
        token = str(start + limit) if start + limit < len(rows) else None
        return httpx.Response(200, json={"success": True, "instances": page,
                                         "next_token": token, "total_instances": len(rows)})

    def one(self, method: str, iid: int, req: httpx.Request) -> httpx.Response:
        inst = self.instances.get(iid)
        if method == "GET":
            return httpx.Response(200, json={"instances": inst})
        if inst is None:
            return httpx.Response(404, json={"success": False, "error": "no_such_instance",
                                             "msg": f"Instance {iid} not found."})
        if method == "PUT":
            body = json.loads(req.content)
            if "label" in body:
                inst["label"] = body["label"]
            if "state" in body:
                inst["actual_status"] = inst["intended_status"] = body["state"]
            return httpx.Response(200, json={"success": True})
        if self.destroy_removes:
            del self.instances[iid]
        return httpx.Response(200, json={"success": True, "msg": "destroying"})


def make_http(provider: str, handler: Recorder, *, attempts: int = 4, key: str = CANARY) -> Http:
    env = {"runpod": "RUNPOD_API_KEY", "vast": "VAST_API_KEY"}[provider]
    return Http(
        provider, f"https://{provider}.test", Secret(key),
        retry=RetryPolicy(attempts=attempts, base_delay=1.0, max_delay=8.0),
        sleep=handler.sleeps.append, rand=lambda: 0.5,
        transport=httpx.MockTransport(handler), hint_env=env,
    )


def query_of(req: httpx.Request) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(str(req.url)).query).items()}
