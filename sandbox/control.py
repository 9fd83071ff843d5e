"""The sandbox's control surface: JSON over HTTP on its own port, outside the mimicked APIs.

    GET    /health                     seed, world size, instance counts, providers whose SSH
                                       path is cut
    GET    /faults                     pending faults
    POST   /faults                     {kind, target, count=1, ...params} -> queued or applied
    DELETE /faults                     drop every pending fault
    GET    /ledger[?events=0]          billing: per-instance meters, totals, rate changes
    GET    /instances                  every instance, provider-neutral (phase, ssh, driver...)
    POST   /instances                  {provider, count, label_prefix?, image?, gpu_count?,
                                        disk_gb?, tcp_ports?, env?}: rent many at once
    GET    /machines                   the machines, with free GPUs and drivers
    POST   /machines                   {provider, machine_id, price_per_gpu?, other_tenants?,
                                        direct_port_count?}: shape the market (a machine's
                                       price; how many of its GPUs other tenants hold: its
                                       free GPUs go or come back; its direct ports: a box on
                                       it maps its ports only while they all fit)
    GET    /clock, POST /clock         {advance: seconds} moves the world clock forward
    GET    /config, POST /config       {boot_delay?, notice_delay?}
    GET    /host-keys                  {box_id: "ssh-ed25519 ..."} for running boxes
    POST   /accounts                   {provider}: a new account there -> {provider, account,
                                       key}; its key sees its own boxes only
    POST   /ssh-keys                   {key, provider?}: add an account SSH key (both providers)
    POST   /settle                     {timeout?}: wait until no backend call is pending

Fault kinds and targets are described in `sandbox.faults`: request kinds (no_capacity,
offer_gone, rate_limit, server_error, create_timeout, low_bid, listing_gap), instance kinds
(host_death, driver_drift, container_restart, preempt, heartbeat_lost, sshd_hang, sshd_heal)
and provider kinds (ssh_path_cut, ssh_path_restore, target `runpod` or `vast`). Optional params:
`status` (server_error), `body` ("text" | "json" | "quota", Vast rate_limit), `retry_after`
(RunPod rate_limit), `delay` (create_timeout: answer late instead of dropping), `driver`
(driver_drift). A fault that reaches a box (drift, restart, sshd_hang, ssh_path_cut, ...) is in
effect once POST /settle returns.
"""

from __future__ import annotations

from typing import Any

from sandbox.catalog import Machine
from sandbox.faults import FaultError
from sandbox.httpbase import Request, Response, json_response
from sandbox.world import PROVIDERS, World, WorldError


def machine_view(m: Machine) -> dict[str, Any]:
    return {
        "provider": m.provider, "machine_id": m.machine_id, "card": m.card.display,
        "gpu_count": m.gpu_count, "free_gpus": m.free_gpus, "price_per_gpu": m.price,
        "driver": m.driver, "actual_driver": m.actual_driver, "cuda": m.cuda,
        "vendor": m.vendor, "rocm": m.rocm,
        "reliability": m.reliability, "direct_port_count": m.direct_port_count,
        "country": m.country, "datacenter": m.datacenter, "location": m.location,
        "public_ip": m.public_ip, "dead": m.dead_at is not None,
        "gpus": [{"uuid": g.uuid, "name": g.name, "pci_bus_id": g.pci_bus_id,
                  "memory_total": g.memory_total, "serial": g.serial} for g in m.gpus],
    }


class ControlApp:
    def __init__(self, world: World) -> None:
        self.world = world

    def __call__(self, req: Request) -> Response:
        route = (req.method, req.path.rstrip("/") or "/")
        handler = {
            ("GET", "/health"): self.health,
            ("GET", "/faults"): self.faults,
            ("POST", "/faults"): self.add_fault,
            ("DELETE", "/faults"): self.clear_faults,
            ("GET", "/ledger"): self.ledger,
            ("GET", "/instances"): self.instances,
            ("POST", "/instances"): self.create_instances,
            ("GET", "/machines"): self.machines,
            ("POST", "/machines"): self.shape_machine,
            ("GET", "/clock"): self.clock,
            ("POST", "/clock"): self.clock,
            ("GET", "/config"): self.config,
            ("POST", "/config"): self.config,
            ("GET", "/host-keys"): self.host_keys,
            ("POST", "/ssh-keys"): self.ssh_keys,
            ("POST", "/accounts"): self.add_account,
            ("POST", "/settle"): self.settle,
        }.get(route)
        if handler is None:
            return json_response(404, {"error": f"no control route {req.method} {req.path}"})
        try:
            body = req.json() if req.method == "POST" else {}
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            return json_response(200, handler(req, body))
        except (FaultError, WorldError, ValueError, KeyError, TypeError) as exc:
            return json_response(400, {"error": str(exc)})

    def health(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        with self.world.lock:
            counts = {p: len(self.world.live(p)) for p in PROVIDERS}
            return {"ok": True, "seed": self.world.seed, "instances": counts,
                    "machines": {p: len(self.world.machines[p]) for p in PROVIDERS},
                    "ssh_path_cut": sorted(self.world.ssh_cut), "now": self.world.now(),
                    "accounts": {p: len(self.world.accounts[p]) for p in PROVIDERS}}

    def faults(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        return {"faults": self.world.faults.pending()}

    def add_fault(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        params = {k: v for k, v in body.items() if k not in ("kind", "target", "count")}
        return self.world.inject(
            str(body["kind"]), str(body.get("target", "*")), int(body.get("count", 1)), **params
        )

    def clear_faults(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        return {"cleared": self.world.faults.clear()}

    def ledger(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        with self.world.lock:
            self.world.tick()
            return self.world.ledger.snapshot(self.world.now(), req.query.get("events") != "0")

    def instances(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        with self.world.lock:
            self.world.tick()
            return {"instances": [self.world.describe(i) for i in self.world.instances.values()]}

    def create_instances(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        provider = str(body["provider"])
        if provider not in PROVIDERS:
            raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}")
        made = self.world.create_many(
            provider, int(body["count"]), label_prefix=str(body.get("label_prefix", "bulk")),
            image=str(body.get("image", "sandbox")), gpu_count=int(body.get("gpu_count", 1)),
            disk_gb=float(body.get("disk_gb", 20)), tcp_ports=body.get("tcp_ports") or [22],
            env=body.get("env") or {},
        )
        with self.world.lock:
            return {"instances": [self.world.describe(i) for i in made]}

    def machines(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        with self.world.lock:
            return {"machines": [machine_view(m) for p in PROVIDERS
                                 for m in self.world.machines[p]]}

    def shape_machine(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        provider, machine_id = str(body["provider"]), str(body["machine_id"])
        m = self.world.machine(provider, machine_id) if provider in PROVIDERS else None
        if m is None:
            raise ValueError(f"no {provider} machine {machine_id!r}")
        with self.world.lock:
            if "price_per_gpu" in body:
                price = float(body["price_per_gpu"])
                if not price > 0:
                    raise ValueError(f"price_per_gpu must be positive, got {price}")
                m.price = price
            if "direct_port_count" in body:  # a host's port range: its boxes map what fits
                count = int(body["direct_port_count"])
                if count < 0:
                    raise ValueError(f"direct_port_count must be 0 or more, got {count}")
                m.direct_port_count = count
            if "other_tenants" in body:
                self.world.set_other_tenants(m, int(body["other_tenants"]))
            return machine_view(m)

    def clock(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        if "advance" in body:
            self.world.advance(float(body["advance"]))
        return {"now": self.world.now()}

    def config(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        with self.world.lock:
            if "boot_delay" in body:
                self.world.boot_delay = float(body["boot_delay"])
            if "notice_delay" in body:
                self.world.notice_delay = float(body["notice_delay"])
            return {"boot_delay": self.world.boot_delay, "notice_delay": self.world.notice_delay}

    def host_keys(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        with self.world.lock:
            return {i.key: i.endpoints.host_key for i in self.world.instances.values()
                    if i.phase == "running" and i.endpoints and i.endpoints.host_key}

    def ssh_keys(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        key = str(body["key"]).strip()
        providers = [str(body["provider"])] if body.get("provider") else list(PROVIDERS)
        with self.world.lock:
            for p in providers:
                if key not in self.world.ssh_keys[p]:
                    self.world.ssh_keys[p].append(key)
            return {p: len(self.world.ssh_keys[p]) for p in providers}

    def add_account(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        provider = str(body["provider"])
        key = self.world.add_account(provider)
        return {"provider": provider, "account": self.world.account(provider, key), "key": key}

    def settle(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        return {"settled": self.world.settle(float(body.get("timeout", 30)))}
