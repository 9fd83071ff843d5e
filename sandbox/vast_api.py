"""Vast.ai's REST API, as the official `vastai` client and fleet's client speak it.

Routes (under `$VAST_URL`):

    POST   /api/v0/bundles/                 search offers ({field: {op: value}}, order, type, ...)
    PUT    /api/v0/search/asks/             the same, body {"select_cols": [...], "q": {...}}
    PUT    /api/v0/asks/{offer}/            create -> {"success", "new_contract", ...}
    GET    /api/v1/instances/               list, <= 25 a page, opaque next_token
    GET    /api/v0/instances/               410 deprecated_endpoint (as the real one now does)
    GET    /api/v0/instances/{id}/          {"instances": {...}} or {"instances": null}
    PUT    /api/v0/instances/{id}/          {"state": "stopped"|"running"} or {"label": ...}
    DELETE /api/v0/instances/{id}/          destroy
    PUT    /api/v0/instances/               bulk state {"ids": [...], "state": ...}
    DELETE /api/v0/instances/               bulk destroy {"instance_ids": [...]}
    PUT    /api/v0/instances/reboot/{id}/   container restart
    PUT    /api/v0/instances/bid_price/{id}/ change a spot bid
    GET|POST /api/v0/ssh/                   the account's SSH keys
    GET    /api/v0/users/current/           the account
    GET    /api/v0/charges/                 per-instance charges in a `day` window, paged

Shapes follow the research notes (`{"success": false, "error", "msg"}` errors, 429 as plain
text without Retry-After, `HostPort` as a string, `ports` only once running).
"""

from __future__ import annotations

import base64
import json
import random
import re
import shlex
from collections.abc import Callable
from typing import Any

from sandbox.catalog import Machine, driver_number, make_machine, rocm_line
from sandbox.faults import REQUEST_KINDS, Call, Fault
from sandbox.httpbase import Request, Response, json_response, text_response
from sandbox.vast_index import VastIndex
from sandbox.vast_query import (
    QueryError,
    check_fields,
    first_after,
    keyset,
    matches,
    order_rows,
    row_position,
)
from sandbox.world import VAST_STORAGE_GB_MONTH, Instance, World, WorldError, vast_storage_rate

ASK_BASE = 30_000_000  # offer id = ASK_BASE + machine position * 100 + GPU count
PAGE_MAX = 25
SEARCH_CONTROLS = {"order", "type", "limit", "allocated_storage", "disable_bundling"}
# Columns GET /api/v1/instances/ may filter on; computed ones are refused, as Vast does.
COMPUTED_INSTANCE_COLS = {"dph_total", "duration", "uptime_mins", "storage_total_cost"}
MIN_DISK_GB = 8.0


def _without(resp: Response, label: str) -> Response:
    """A listing page that leaves out the instance labelled `label` (fault listing_gap)."""
    body = json.loads(resp.body)
    body["instances"] = [i for i in body.get("instances") or [] if i.get("label") != label]
    return json_response(resp.status, body)


def _err(status: int, error: str, msg: str, **extra: Any) -> Response:
    return json_response(status, {"success": False, "error": error, "msg": msg, **extra})


def _not_found(instance_id: str) -> Response:
    return _err(404, "no_such_instance", f"Instance {instance_id} not found.")


# -- offers ------------------------------------------------------------------------------------


def offer_id(position: int, gpus: int) -> int:
    return ASK_BASE + position * 100 + gpus


def chunk_sizes(free: int) -> list[int]:
    """The GPU counts a machine with `free` GPUs offers: powers of two, and all of them."""
    return sorted({n for n in (1, 2, 4, 8) if n <= free} | ({free} if free else set()))


def prices(m: Machine, gpus: int) -> tuple[float, float]:
    """(dph_base, min_bid) for `gpus` GPUs of `m`: on-demand and the lowest spot bid, per hour."""
    dph_base = round(m.price * gpus, 4)
    return dph_base, round(dph_base * 0.45, 4)


def gpu_stack(m: Machine) -> dict[str, Any]:
    """What a row says of the machine's GPU software: NVIDIA's highest CUDA (`cuda_max_good`),
    or on an AMD machine (`gpu_arch` "amd", whose `driver_version` is the amdgpu driver's) no
    CUDA and the ROCm release line, as a number as `cuda_max_good` is (`rocm_version`)."""
    if m.vendor == "amd":
        return {"cuda_max_good": None, "rocm_version": float(rocm_line(m.rocm))}
    return {"cuda_max_good": float(m.cuda), "rocm_version": None}


def offer_row(now: float, position: int, m: Machine, gpus: int, bid: bool,
              storage_gb: float) -> dict[str, Any]:
    card = m.card
    dph_base, min_bid = prices(m, gpus)
    gpu_cost = min_bid if bid else dph_base
    storage_total = vast_storage_rate(storage_gb)
    dph_total = gpu_cost + storage_total
    dlperf = round(card.tflops * gpus * 0.9, 3)
    oid = offer_id(position, gpus)
    return {
        "id": oid, "ask_contract_id": oid, "bundle_id": oid, "bundled_results": None,
        "machine_id": int(m.machine_id), "host_id": m.host_id, "hostname": None,
        "num_gpus": gpus, "gpu_name": card.vast_name, "gpu_ram": card.memory_gb * 1024,
        "gpu_total_ram": card.memory_gb * 1024 * gpus, "gpu_frac": gpus / m.gpu_count,
        "gpu_arch": m.vendor, "gpu_lanes": 16, "gpu_mem_bw": 900.0, "gpu_max_power": 450.0,
        "gpu_max_temp": 85.0, "gpu_display_active": False, "compute_cap": card.compute_cap,
        **gpu_stack(m), "driver_version": m.driver,
        "driver_vers": driver_number(m.driver), "bw_nvlink": 0.0,
        "cpu_name": "AMD EPYC 7543 32-Core Processor", "cpu_arch": "amd64",
        "cpu_cores": m.cpu_cores, "cpu_cores_effective": m.cpu_cores * gpus / m.gpu_count,
        "cpu_ghz": 2.8, "cpu_ram": m.ram_gb * 1024, "disk_space": float(m.disk_gb),
        "disk_bw": 2000.0, "disk_name": "nvme", "inet_up": m.inet_up, "inet_down": m.inet_down,
        "inet_up_cost": 0.002, "inet_down_cost": 0.002, "direct_port_count": m.direct_port_count,
        "static_ip": m.datacenter, "pci_gen": 4.0, "pcie_bw": 25.0, "mobo_name": "H12SSL-i",
        "os_version": "22.04", "has_avx": 1, "dph_base": gpu_cost, "dph_total": dph_total,
        "min_bid": min_bid, "is_bid": bid, "dlperf": dlperf,
        "dlperf_per_dphtotal": dlperf / dph_total, "total_flops": card.tflops * gpus,
        "flops_per_dphtotal": card.tflops * gpus / dph_total,
        "score": round(dlperf / dph_total * m.reliability, 4),
        "vram_costperhour": gpu_cost / (card.memory_gb * gpus),
        "storage_cost": VAST_STORAGE_GB_MONTH, "storage_total_cost": storage_total,
        "credit_discount_max": 0.0, "discounted_dph_total": dph_total,
        "rentable": True, "rented": False, "external": False,
        "hosting_type": 1 if m.datacenter else 0, "public_ipaddr": m.public_ip,
        "geolocation": m.location, "geolocode": 0, "reliability": m.reliability,
        "reliability2": m.reliability, "reliability_mult": 1.0,
        "expected_reliability": m.reliability, "verification": "verified", "vericode": 1,
        "vms_enabled": False, "is_vm_deverified": False, "cluster_id": None,
        "resource_type": "gpu", "start_date": now, "end_date": now + 30 * 86400.0,
        "duration": 30 * 86400.0, "logo": "/static/logos/vastai_small2.png", "webpage": None,
        "search": {"gpuCostPerHour": gpu_cost, "diskHour": storage_total,
                   "totalHour": dph_total, "discountTotalHour": 0.0,
                   "discountedTotalPerHour": dph_total},
        "instance": {"gpuCostPerHour": gpu_cost, "diskHour": storage_total,
                     "totalHour": dph_total, "discountTotalHour": 0.0,
                     "discountedTotalPerHour": dph_total},
    }


def all_offers(world: World, bid: bool = False, storage_gb: float = 5.0) -> list[dict[str, Any]]:
    rows = []
    for position, m in enumerate(world.machines["vast"]):
        for gpus in chunk_sizes(m.free_gpus):
            rows.append(offer_row(world.now(), position, m, gpus, bid, storage_gb))
    return rows


# The searchable columns: whatever an offer row has (rendered once, so the two cannot drift).
OFFER_FIELDS = frozenset(offer_row(0.0, 0, make_machine(random.Random(0), "vast", 0), 1,
                                   False, 5.0)) | {"target_reliability"}


def search(world: World, q: dict[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(q, dict):
        raise QueryError("query must be a JSON object")
    kind = str(q.get("type") or "on-demand")
    storage = float(q.get("allocated_storage") or 5.0)
    rows = all_offers(world, bid=kind in ("bid", "interruptible"), storage_gb=storage)
    filters = {k: v for k, v in q.items() if k not in SEARCH_CONTROLS}
    check_fields(filters, OFFER_FIELDS, "offers")
    filters.pop("target_reliability", None)
    rows = [r for r in rows if r["disk_space"] >= storage and matches(r, filters)]
    rows = order_rows(rows, q.get("order") or [["score", "desc"]])
    limit = q.get("limit")
    return rows[: int(limit)] if limit else rows


def find_offer(world: World, ask_id: int) -> tuple[Machine, int] | None:
    position, gpus = divmod(ask_id - ASK_BASE, 100)
    machines = world.machines["vast"]
    if not (0 <= position < len(machines)) or gpus < 1:
        return None
    machine = machines[position]
    return (machine, gpus) if gpus in chunk_sizes(machine.free_gpus) else None


# -- instances ---------------------------------------------------------------------------------


def parse_env(env: Any) -> tuple[dict[str, str], list[int], list[list[str]]]:
    """Vast's env: a dict (`{"-p 26611:26611": "1", "K": "v"}`) or a docker-flag string.
    Returns (environment, container TCP ports mapped with -p, extra_env as Vast echoes it)."""
    if isinstance(env, str):
        pairs: dict[str, str] = {}
        words = shlex.split(env)
        for flag, value in zip(words, words[1:], strict=False):
            if flag == "-e" and "=" in value:
                k, v = value.split("=", 1)
                pairs[k] = v
            elif flag == "-p":
                pairs[f"-p {value}"] = "1"
        env = pairs
    if not isinstance(env, dict):
        raise ValueError("env must be an object or a docker-flag string")
    variables: dict[str, str] = {}
    ports: list[int] = []
    for key, value in env.items():
        if key.startswith("-p "):
            container = key[3:].split(":")[-1].split("/")[0]
            ports.append(int(container))
        elif not key.startswith("-"):
            variables[str(key)] = str(value)
    return variables, ports, [[str(k), str(v)] for k, v in env.items()]


def _direct(inst: Instance) -> bool:
    runtype = str(inst.extra.get("runtype") or "")
    return "ssh_direc" in runtype


def _mapped_ports(inst: Instance) -> list[int]:
    wanted = ([22] if _direct(inst) else []) + [p for p in inst.tcp_ports if p != 22]
    return wanted if inst.machine.direct_port_count >= len(wanted) else []


def actual_status(world: World, inst: Instance) -> str | None:
    if world.host_noticed(inst, 2.0):
        return "offline"
    if world.host_noticed(inst):
        return "unknown"
    if inst.phase == "provisioning":
        return "loading" if inst.backend_live else None
    return inst.phase  # running, stopped, exited, scheduling


def instance_row(world: World, inst: Instance) -> dict[str, Any]:
    m = inst.machine
    ep = inst.endpoints if inst.phase == "running" else None
    ports: dict[str, list[dict[str, str]]] = {}
    if ep is not None:
        for p in _mapped_ports(inst):
            if p in ep.ports:
                ports[f"{p}/tcp"] = [{"HostIp": "0.0.0.0", "HostPort": str(ep.ports[p])}]
    host_ports = [int(v[0]["HostPort"]) for v in ports.values()]
    now = world.now()
    storage = inst.storage_rate
    live = inst.phase in ("provisioning", "running", "scheduling")
    return {
        "id": int(inst.id), "machine_id": int(m.machine_id), "host_id": m.host_id,
        "bundle_id": inst.extra.get("ask_id"), "label": inst.label or None,
        "actual_status": actual_status(world, inst),
        "intended_status": inst.intended,
        "cur_state": "running" if live else "stopped",
        "next_state": inst.intended,
        "status_msg": inst.status_msg,
        "image_uuid": inst.image, "image_args": inst.extra.get("args") or [],
        "image_runtype": inst.extra.get("runtype") or "ssh",
        "onstart": inst.start_hook, "extra_env": inst.extra.get("extra_env", []),
        "ssh_host": ep.ssh_host if ep else None, "ssh_port": ep.ssh_port if ep else None,
        "ssh_idx": None, "machine_dir_ssh_port": None,
        # Vast's address strings carry whitespace; clients strip them
        "public_ipaddr": (ep.public_ip if ep else m.public_ip) + "\n",
        "local_ipaddrs": "172.17.0.1 \n",
        "direct_port_start": min(host_ports) if host_ports else -1,
        "direct_port_end": max(host_ports) if host_ports else -1,
        "direct_port_count": m.direct_port_count,
        "ports": ports,
        "gpu_name": m.card.vast_name, "num_gpus": inst.gpu_count,
        "gpu_ram": m.card.memory_gb * 1024,
        "gpu_totalram": m.card.memory_gb * 1024 * inst.gpu_count,
        "gpu_util": 0.0 if ep else None, "gpu_temp": 35.0 if ep else None,
        "driver_version": m.driver, **gpu_stack(m), "gpu_arch": m.vendor,
        "compute_cap": m.card.compute_cap, "cpu_cores": m.cpu_cores, "cpu_ram": m.ram_gb * 1024,
        "disk_space": inst.disk_gb, "dph_base": inst.gpu_rate, "dph_total": inst.gpu_rate + storage,
        "storage_cost": VAST_STORAGE_GB_MONTH, "storage_total_cost": storage,
        "inet_up_cost": 0.002, "inet_down_cost": 0.002,
        "min_bid": inst.extra.get("min_bid"), "is_bid": inst.spot,
        "start_date": inst.created_at, "end_date": inst.created_at + 30 * 86400.0,
        "uptime_mins": (now - inst.started_at) / 60 if inst.started_at else None,
        "reliability2": m.reliability, "geolocation": m.location,
        "hosting_type": 1 if m.datacenter else 0, "verification": "verified",
        "template_id": None, "template_hash_id": inst.extra.get("template_hash_id"),
        "jupyter_token": None,
    }


# -- the app -----------------------------------------------------------------------------------


Handler = Callable[[Request, re.Match[str], Fault | None], Response]


class VastApp:
    """The REST routes over a `World`. `key` opens the world's first Vast account; each key
    the world has for Vast (`World.add_account`) opens its own, and only its own boxes."""

    def __init__(self, world: World, key: str) -> None:
        self.world = world
        self.key = world.add_account("vast", key)
        account = world.account("vast", key)
        self.index = VastIndex(world, account=account)  # the key's live instances by id
        self._indexes = {account: self.index}  # every account's, made when first listed
        self.routes: list[tuple[str, re.Pattern[str], str, frozenset[str], Handler, bool]] = []
        route = self._route
        route("POST", r"/api/v0/bundles/", "search", {"search"}, self.bundles, False)
        route("PUT", r"/api/v0/search/asks/", "search", {"search"}, self.search_asks, False)
        route("PUT", r"/api/v0/asks/(\d+)/", "create", {"create"}, self.create)
        route("GET", r"/api/v1/instances/", "list", {"list"}, self.list_v1)
        route("GET", r"/api/v0/instances/", "list_v0", {"list"}, self.list_v0)
        route("PUT", r"/api/v0/instances/", "manage", {"stop", "start"}, self.bulk_state)
        route("DELETE", r"/api/v0/instances/", "destroy", {"destroy"}, self.bulk_destroy)
        route("PUT", r"/api/v0/instances/reboot/(\d+)/", "reboot", set(), self.reboot)
        route("PUT", r"/api/v0/instances/bid_price/(\d+)/", "change_bid", set(), self.change_bid)
        route("GET", r"/api/v0/instances/(\d+)/", "show", {"show"}, self.show)
        route("PUT", r"/api/v0/instances/(\d+)/", "manage", {"stop", "start"}, self.manage)
        route("DELETE", r"/api/v0/instances/(\d+)/", "destroy", {"destroy"}, self.destroy)
        route("GET", r"/api/v0/ssh/", "ssh_keys", set(), self.ssh_list)
        route("POST", r"/api/v0/ssh/", "ssh_keys", set(), self.ssh_add)
        route("GET", r"/api/v0/users/current/", "user", set(), self.user)
        route("GET", r"/api/v0/charges/", "charges", {"charges"}, self.charges)

    def _route(self, method: str, pattern: str, name: str, aliases: set[str],
               handler: Handler, auth: bool = True) -> None:
        self.routes.append(
            (method, re.compile(pattern + "$"), name, frozenset(aliases), handler, auth)
        )

    def __call__(self, req: Request) -> Response:
        path = req.path if req.path.endswith("/") else req.path + "/"
        for method, pattern, name, aliases, handler, auth in self.routes:
            match = pattern.match(path)
            if match is None or method != req.method:
                continue
            if auth and self.world.account("vast", req.bearer()) is None:
                return _err(401, "auth_error", "Invalid user key")
            call = Call("vast", name, aliases)
            kinds = REQUEST_KINDS if name == "create" else (
                {"rate_limit", "server_error", "no_capacity"} if name == "search"
                else {"rate_limit", "server_error", "listing_gap"} if name == "list"
                else {"rate_limit", "server_error"})
            fault = self.world.faults.take(call, kinds)
            if fault is not None and fault.kind in ("rate_limit", "server_error"):
                return self._request_fault(fault)
            try:
                with self.world.lock:
                    self.world.tick()
                    return handler(req, match, fault)
            except WorldError as exc:
                return _err(404 if exc.code == "no_such_instance" else 400, exc.code, exc.message)
            except (ValueError, QueryError) as exc:
                return _err(400, "invalid_args", str(exc))
        return _err(404, "not_found", f"no route for {req.method} {req.path}")

    def _account(self, req: Request) -> int:
        """The account the request's key opens (checked before any handler runs)."""
        account = self.world.account("vast", req.bearer())
        assert account is not None
        return account

    def _get(self, req: Request, instance_id: str) -> Instance | None:
        """The key's own live instance `instance_id`: another account's is none."""
        return self.world.get("vast", instance_id, self._account(req))

    @staticmethod
    def _request_fault(fault: Fault) -> Response:
        if fault.kind == "server_error":
            status = int(fault.params.get("status", 500))
            return _err(status, "server_error", "Internal server error")
        variant = fault.params.get("body", "text")
        if variant == "json":
            detail = "API requests too frequent endpoint threshold=4.5"
            return json_response(429, {"detail": detail})
        if variant == "quota":
            return json_response(429, {"error": "search_quota_exceeded",
                                       "msg": "Daily search quota exceeded"})
        return text_response(429, "API requests too frequent")  # Vast sends no Retry-After

    # -- search ----------------------------------------------------------------------------

    def bundles(self, req: Request, _: re.Match[str], fault: Fault | None) -> Response:
        return self._search(req.json(), fault)

    def search_asks(self, req: Request, _: re.Match[str], fault: Fault | None) -> Response:
        return self._search((req.json() or {}).get("q") or {}, fault)

    def _search(self, q: dict[str, Any], fault: Fault | None) -> Response:
        if fault is not None:  # no_capacity: the market is empty right now
            return json_response(200, {"offers": []})
        return json_response(200, {"offers": search(self.world, q)})

    # -- create ----------------------------------------------------------------------------

    def create(self, req: Request, match: re.Match[str], fault: Fault | None) -> Response:
        ask_id = int(match.group(1))
        body = req.json()
        found = find_offer(self.world, ask_id)
        gone = found is None or (fault is not None and fault.kind in ("no_capacity", "offer_gone"))
        if fault is not None and fault.kind == "offer_gone" and found is not None:
            self.world.take_capacity(found[0], found[0].free_gpus)
        if gone:
            if body.get("cancel_unavail"):
                return _err(410, "no_such_ask",
                            f"error 410/3907: no_such_ask Instance type {ask_id} is no longer "
                            "available.")
            return _err(404, "invalid_args",
                        f"error 404/3603: no_such_ask Instance type by id {ask_id} is not "
                        "available.", ask_id=ask_id)
        assert found is not None
        machine, gpus = found
        image = body.get("image")
        if not image:
            return _err(400, "invalid_args", "error 400/3467: image is required", ask_id=ask_id)
        disk = float(body.get("disk") or 10)
        if disk < MIN_DISK_GB:
            return _err(400, "invalid_args", f"error 400/3467: disk must be >= {MIN_DISK_GB:g} GB",
                        ask_id=ask_id)
        label = body.get("label") or ""
        if len(label) > 256:
            return _err(400, "invalid_args", "error 400/3467: label too long", ask_id=ask_id)
        env, ports, extra_env = parse_env(body.get("env") or {})
        dph_base, min_bid = prices(machine, gpus)
        price = body.get("price")
        if price is not None and not 0.001 <= float(price) <= 128:
            return _err(400, "invalid_price", "error 400/3467: price must be in [0.001, 128]",
                        ask_id=ask_id)
        low_bid = price is not None and float(price) < min_bid
        low_bid = low_bid or (fault is not None and fault.kind == "low_bid")
        inst = self.world.create(
            "vast", machine, gpus, image=image, label=label, env=env, tcp_ports=ports,
            disk_gb=disk, gpu_rate=float(price) if price is not None else dph_base,
            storage_rate=vast_storage_rate(disk), stopped=low_bid,
            start_hook=body.get("onstart") or None, spot=price is not None,
            bid=float(price) if price is not None else None, account=self._account(req),
            extra={"ask_id": ask_id, "min_bid": min_bid, "runtype": body.get("runtype"),
                   "args": body.get("args"), "extra_env": extra_env,
                   "template_hash_id": body.get("template_hash_id")},
        )
        if low_bid:  # Vast creates the instance stopped and says so, id included
            bid = f"${float(price):.4f}/hr" if price is not None else "no bid"
            return _err(400, "insufficient_bid",
                        f"error 400/3467: {bid} is below the minimum ${min_bid:.4f}/hr; the "
                        "instance was created stopped", new_contract=int(inst.id), ask_id=ask_id)
        resp = json_response(200, {"success": True, "new_contract": int(inst.id),
                                   "instance_api_key": inst.api_key})
        if fault is not None and fault.kind == "create_timeout":
            resp.delay = float(fault.params.get("delay", 0))
            resp.drop = resp.delay == 0
        return resp

    # -- read ------------------------------------------------------------------------------

    def list_v0(self, req: Request, _: re.Match[str], fault: Fault | None) -> Response:
        return _err(410, "deprecated_endpoint",
                    "/api/v0/instances/ is deprecated. Use /api/v1/instances/ instead.")

    def list_v1(self, req: Request, _: re.Match[str], fault: Fault | None) -> Response:
        """One page, keyset-paged: `next_token` holds the last row's position (its values of
        the `keyset` columns), the next page starts after it. In id order without filters
        (what the SDK and fleet ask for) the page comes from the id index: the rows are
        O(limit + log n); any other order or a filter renders, filters and sorts every row."""
        if fault is not None and fault.kind == "listing_gap":
            return _without(self.list_v1(req, _, None), str(fault.params.get("drop")))
        args = {k: _json_arg(v) for k, v in req.query.items()}
        filters = args.get("select_filters") or {}
        if not isinstance(filters, dict):
            raise QueryError("select_filters must be a JSON object")
        order = args.get("order_by") or DEFAULT_ORDER
        if not filters:
            keys = keyset(order)
            if len(keys) == 1:  # [("id", asc or desc)]
                return self._list_by_id(args, desc=keys[0][1], account=self._account(req))
        return self._list_full(args, filters, order, self._account(req))

    def _list_by_id(self, args: dict[str, Any], desc: bool, account: int) -> Response:
        limit = _page_limit(args)
        cursor = _token_cursor(args.get("after_token"), 1)
        after = None
        if cursor is not None:
            if not isinstance(cursor[0], int) or isinstance(cursor[0], bool):
                raise QueryError("invalid after_token")
            after = cursor[0]
        index = self._indexes.get(account)
        if index is None:
            index = self._indexes[account] = VastIndex(self.world, account=account)
        index.sync()
        total, label_counts = index.summary(desc)
        insts = index.walk(after, desc, limit + 1)
        page = [instance_row(self.world, i) for i in insts[:limit]]
        more = len(insts) > limit
        return _list_answer(args, page, total, label_counts,
                            _cursor_token([page[-1]["id"]]) if more else None)

    def _list_full(self, args: dict[str, Any], filters: dict[str, Any],
                     order: Any, account: int) -> Response:
        """The listing from every row of the account: rendered, filtered, sorted, then the
        page after the cursor found by binary search. O(n log n) a page."""
        rows = [instance_row(self.world, i) for i in self.world.live("vast", account)]
        for name in filters:
            if name in COMPUTED_INSTANCE_COLS or (rows and name not in rows[0]):
                raise QueryError(f"{name} is not a valid search key")
        rows = [r for r in rows if matches(r, filters)]
        rows = order_rows(rows, order)
        keys = keyset(order)
        limit = _page_limit(args)
        cursor = _token_cursor(args.get("after_token"), len(keys))
        start = 0 if cursor is None else first_after(rows, keys, cursor)
        page = rows[start: start + limit]
        more = start + limit < len(rows)
        label_counts: dict[str, int] = {}
        for r in rows:
            label_counts[r["label"] or ""] = label_counts.get(r["label"] or "", 0) + 1
        return _list_answer(args, page, len(rows), json.dumps(label_counts),
                            _cursor_token(row_position(page[-1], keys)) if more else None)

    def show(self, req: Request, match: re.Match[str], fault: Fault | None) -> Response:
        inst = self._get(req, match.group(1))
        row = instance_row(self.world, inst) if inst is not None else None
        return json_response(200, {"instances": row})

    # -- change ----------------------------------------------------------------------------

    def _inst(self, req: Request, instance_id: str) -> Instance:
        inst = self._get(req, instance_id)
        if inst is None:
            raise WorldError("no_such_instance", f"Instance {instance_id} not found.")
        return inst

    def manage(self, req: Request, match: re.Match[str], fault: Fault | None) -> Response:
        instance_id = match.group(1)
        body = req.json()
        try:
            inst = self._inst(req, instance_id)
            if "label" in body:
                label = str(body["label"] or "")
                if len(label) > 1024:
                    return _err(400, "label_too_long", "label must be at most 1024 characters")
                inst.label = label
                return json_response(200, {"success": True,
                                           "msg": f"label for {instance_id} set to '{label}'"})
            self._set_state(inst, body.get("state"))
        except WorldError:
            return _not_found(instance_id)
        return json_response(200, {"success": True})

    def _set_state(self, inst: Instance, state: Any) -> None:
        if state == "stopped":
            self.world.stop(inst)
        elif state == "running":
            self.world.resume(inst, wait_for_gpus=True)
        else:
            raise ValueError(f"state must be 'running' or 'stopped', not {state!r}")

    def bulk_state(self, req: Request, _: re.Match[str], fault: Fault | None) -> Response:
        body = req.json()
        for instance_id in body.get("ids") or []:
            inst = self._get(req, str(instance_id))
            if inst is not None:
                self._set_state(inst, body.get("state"))
        return json_response(200, {"success": True})

    def destroy(self, req: Request, match: re.Match[str], fault: Fault | None) -> Response:
        instance_id = match.group(1)
        inst = self._get(req, instance_id)
        if inst is None:
            return _not_found(instance_id)
        self.world.destroy(inst)
        return json_response(200, {"success": True, "msg": f"destroying instance {instance_id}."})

    def bulk_destroy(self, req: Request, _: re.Match[str], fault: Fault | None) -> Response:
        done = []
        for instance_id in req.json().get("instance_ids") or []:
            inst = self._get(req, str(instance_id))
            if inst is not None:
                self.world.destroy(inst)
                done.append(int(instance_id))
        return json_response(200, {"success": True, "destroyed": done})

    def reboot(self, req: Request, match: re.Match[str], fault: Fault | None) -> Response:
        try:
            self.world.restart_container(self._inst(req, match.group(1)))
        except WorldError as exc:
            if exc.code == "no_such_instance":
                return _not_found(match.group(1))
            return _err(400, "invalid_args", exc.message)
        return json_response(200, {"success": True})

    def change_bid(self, req: Request, match: re.Match[str], fault: Fault | None) -> Response:
        try:
            inst = self._inst(req, match.group(1))
        except WorldError:
            return _not_found(match.group(1))
        price = float(req.json().get("price") or 0)
        inst.bid = inst.gpu_rate = price
        inst.spot = True
        if inst.phase == "stopped" and price >= float(inst.extra.get("min_bid") or 0):
            self.world.resume(inst, wait_for_gpus=True)
        return json_response(200, {"success": True})

    # -- account ---------------------------------------------------------------------------

    def ssh_list(self, req: Request, _: re.Match[str], fault: Fault | None) -> Response:
        keys = self.world.ssh_keys["vast"]
        return json_response(200, [{"id": i + 1, "public_key": k} for i, k in enumerate(keys)])

    def ssh_add(self, req: Request, _: re.Match[str], fault: Fault | None) -> Response:
        key = str(req.json().get("ssh_key") or "").strip()
        if not key:
            return _err(400, "invalid_args", "ssh_key is required")
        keys = self.world.ssh_keys["vast"]
        if key not in keys:
            keys.append(key)
        return json_response(200, {"success": True, "id": keys.index(key) + 1, "key": key})

    def charges(self, req: Request, _: re.Match[str], fault: Fault | None) -> Response:
        """Per-instance charges within `select_filters.day` (`{"gte", "lte"}` in unix seconds,
        required: 400 without it, as on Vast), each clipped to that window (the sandbox's
        choice: Vast does not say whether `amount` is clipped), oldest first or newest first
        with `latest_first`; `limit` (default 100, at most 500) a page, then `after_token`
        from `next_token`. `select_filters.type` (`{"in": [...]}` or `{"eq": ...}`) keeps
        the kinds asked for; instances are the only kind the sandbox charges."""
        args = {k: _json_arg(v) for k, v in req.query.items()}
        filters = args.get("select_filters")
        if not isinstance(filters, dict):
            filters = {}
        day = filters.get("day")
        if not isinstance(day, dict) or not {"gte", "lte"} <= set(day):
            return _err(400, "invalid_args", "select_filters.day with gte and lte is required")
        try:
            gte, lte = float(day["gte"]), float(day["lte"])
        except (TypeError, ValueError):
            return _err(400, "invalid_args", "select_filters.day: gte and lte are unix seconds")
        if lte < gte:
            return _err(400, "invalid_args", "select_filters.day: lte is before gte")
        kinds = _kinds(filters.get("type"))
        rows = [] if "instance" not in kinds else [
            charge_row(c) for c in self.world.charges(gte, lte, self.world.now(), "vast",
                                                      self._account(req))]
        rows.sort(key=lambda r: (r["start"], r["source"]), reverse=bool(args.get("latest_first")))
        limit = int(args.get("limit") or CHARGES_PAGE_DEFAULT)
        if not 1 <= limit <= CHARGES_PAGE_MAX:  # ASSUMED: Vast's spec says max 500
            return _err(400, "invalid_args", f"limit must be 1 to {CHARGES_PAGE_MAX}")
        offset = _token_offset(args.get("after_token"))
        page = rows[offset: offset + limit]
        more = offset + limit < len(rows)
        return json_response(200, {
            "success": True, "count": len(page), "total": len(rows),
            "next_token": _token(offset + limit) if more else None, "results": page})

    def user(self, req: Request, _: re.Match[str], fault: Fault | None) -> Response:
        return json_response(200, {"id": self._account(req), "username": "sandbox",
                                   "email": "sandbox@invalid",
                                   "credit": 1000.0, "balance": 0.0, "has_billing": True})


CHARGES_PAGE_DEFAULT, CHARGES_PAGE_MAX = 100, 500


def _kinds(spec: Any) -> set[str]:
    """The charge kinds a `select_filters.type` asks for (all when it names none)."""
    if isinstance(spec, dict) and isinstance(spec.get("in"), list):
        return {str(k) for k in spec["in"]}
    if isinstance(spec, dict) and "eq" in spec:
        return {str(spec["eq"])}
    if isinstance(spec, str):
        return {spec}
    return {"instance", "volume", "serverless"}


def charge_row(c: dict[str, Any]) -> dict[str, Any]:
    """One instance's charges in the window (`Ledger.charges`), as `GET /api/v0/charges/`
    lists them: USD to 3 decimals, one item per kind and rate (storage is Vast's `disk`)."""
    items = [{"type": "gpu" if p["kind"] == "gpu" else "disk", "amount": round(p["usd"], 3),
              "description": f"{p['hours']:.3f} hours at ${p['usd_per_hour']:.3f}/hour"}
             for p in c["items"]]
    return {"start": int(c["start"]), "end": int(c["end"]), "type": "instance",
            "source": f"instance-{c['id']}", "description": f"Instance {c['id']}",
            "amount": round(c["gpu_usd"] + c["storage_usd"], 3),
            "metadata": {"label": c["label"]}, "items": items}


def _json_arg(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


DEFAULT_ORDER = [{"col": "id", "dir": "asc"}]


def _page_limit(args: dict[str, Any]) -> int:
    return max(1, min(PAGE_MAX, int(args.get("limit") or PAGE_MAX)))


def _list_answer(args: dict[str, Any], page: list[dict[str, Any]], total: int,
                 label_counts: str, next_token: str | None) -> Response:
    """The listing's answer, `label_counts` given as JSON text (the index keeps it encoded):
    the same bytes `json_response` would send for the whole object."""
    cols = args.get("select_cols")
    if isinstance(cols, list) and cols and "*" not in cols:
        page = [{k: r[k] for k in ["id", *cols] if k in r} for r in page]
    head = json.dumps({"success": True, "instances_found": len(page), "total_instances": total})
    tail = json.dumps({"next_token": next_token, "instances": page})
    body = f'{head[:-1]}, "label_counts": {label_counts}, {tail[1:]}'
    return Response(200, body.encode(), "application/json")


def _cursor_token(values: list[Any]) -> str:
    """The opaque `next_token` of the instance listing: the last row's position."""
    return base64.urlsafe_b64encode(json.dumps({"k": values}).encode()).decode()


def _token_cursor(token: Any, size: int) -> list[Any] | None:
    """The position an instance listing's `after_token` holds (None without one), which
    must have `size` values (the listing's `keyset` columns)."""
    if not token:
        return None
    try:
        cursor = json.loads(base64.urlsafe_b64decode(str(token).encode()))["k"]
    except (ValueError, KeyError, TypeError) as exc:
        raise QueryError("invalid after_token") from exc
    if not isinstance(cursor, list) or len(cursor) != size:
        raise QueryError("invalid after_token")
    return cursor


# The charges listing's token is still an offset (each of its pages is a full pass over the
# ledger's window anyway). Its rows are never removed, but with `latest_first` an instance made
# between two pages comes first and shifts the next page by one row: unlike a keyset cursor.
def _token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode()


def _token_offset(token: Any) -> int:
    if not token:
        return 0
    try:
        return int(json.loads(base64.urlsafe_b64decode(str(token).encode()))["o"])
    except (ValueError, KeyError, TypeError) as exc:
        raise QueryError("invalid after_token") from exc
