"""Vast.ai through its REST API (`$VAST_URL`, v0 routes plus the paginated v1 listing).

Offers are filtered on the server by exact driver (encoded as the vastai CLI encodes it) and on
`direct_port_count`, then the driver is re-checked here.

AMD offers: Vast marks a host's GPU vendor in `gpu_arch` ("nvidia", "amd"; research:
providers.md's offer record, and third-party parsers that skip `gpu_arch: "amd"` rows). On an
AMD host `driver_version` is the amdgpu driver's. Vast's host guide says AMD machines are
searchable "using standard filters for AMD ROCm", but no public source found names the ROCm
column: the fleet sends `rocm_version` (the release line as a number, as `cuda_max_good` is
for CUDA) and checks it again here, dropping an AMD offer that does not carry one; if Vast
refuses the column, the search fails loudly, never rents unfiltered. The exact ROCm release
is checked after boot by the agent. A create maps each extra TCP port with
`-p P:P` and asks for direct SSH; the SSH endpoint is the direct mapping of 22 when the host
gave one, else Vast's proxy at ssh_host:ssh_port.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx

from fleet.core import cards
from fleet.core.errors import NoCapacity, OfferGone, ProviderError, UsageError
from fleet.core.states import BoxStatus
from fleet.providers.base import (
    Box,
    Offer,
    Offers,
    RentRequest,
    Unreadable,
    positive,
    price,
)
from fleet.providers.client import Client, p2p_public_port

if TYPE_CHECKING:
    from fleet.providers.http import Http

DEFAULT_URL = "https://console.vast.ai"
PAGE = 25  # the most /api/v1/instances/ returns per page
CHARGES_PAGE = 100  # the SDK's page of /api/v0/charges/ (the server allows 500)
RUNTYPE = "ssh_direc ssh_proxy"  # the SDK's spelling: direct SSH, proxy as fallback
_DEFAULTS = {
    "verified": {"eq": True},
    "external": {"eq": False},
    "rentable": {"eq": True},
    "rented": {"eq": False},
}
_GONE_ERRORS = {"no_such_instance", "not_found"}
_PROVISIONING = {None, "", "loading", "created", "scheduling", "rebooting"}
_STATUS = {"running": BoxStatus.RUNNING, "stopped": BoxStatus.STOPPED,
           "frozen": BoxStatus.STOPPED, "exited": BoxStatus.EXITED}


def base_url() -> str:
    return os.environ.get("VAST_URL") or DEFAULT_URL


def driver_code(driver: str) -> int:
    """"580.95.05" -> 580095005: each part zero-padded to three digits, as the vastai CLI sends."""
    parts = driver.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise UsageError(f"driver {driver!r} is not an exact X.Y.Z driver version")
    return int("".join(p.zfill(3) for p in parts))


def status_of(inst: dict[str, Any]) -> BoxStatus:
    """Vast's actual/cur/intended/next states -> the fleet's status."""
    actual = inst.get("actual_status")
    if all(inst.get(k) == "stopped" for k in ("cur_state", "intended_status", "next_state")):
        return BoxStatus.STOPPED  # a spot box outbid, whatever actual_status still says
    if actual == "created" and "error" in str(inst.get("status_msg") or "").lower():
        return BoxStatus.EXITED  # "OCI runtime create failed": the container never started
    if actual in _PROVISIONING:
        return BoxStatus.PROVISIONING
    # unknown, offline: no heartbeat from the host
    return _STATUS.get(str(actual), BoxStatus.UNKNOWN)


class Vast(Client):
    """The Vast.ai REST client. See `Client` for rent and destroy semantics."""

    name = "vast"

    def __init__(self, http: Http, *, storage_gb: float = 10.0, **kw: Any) -> None:
        super().__init__(http, **kw)
        self.storage_gb = storage_gb  # the disk searches price for when not told one

    # -- plumbing ---------------------------------------------------------------------------

    def _call(
        self, method: str, path: str, call: str, *, gone_ok: bool = False, **kw: Any
    ) -> dict[str, Any]:
        """One REST call; returns the JSON body, raising a typed error for a refusal.

        + gone_ok: a refusal saying the instance does not exist returns its body instead
        """
        resp = self.http.request(method, path, call=call, **kw)
        body = self.http.json(resp, call)
        if not isinstance(body, dict):
            body = {"value": body}
        if resp.status_code >= 400:
            if gone_ok and _gone(body):
                return body
            raise self._refusal(call, resp, body)
        return body

    def _refusal(self, call: str, resp: httpx.Response, body: dict[str, Any]) -> ProviderError:
        detail = f"HTTP {resp.status_code}: {_message(body) or self.http.body_snippet(resp)}"
        if "/asks/" in call and (resp.status_code in (404, 410) or "no_such_ask" in detail):
            return self.http.error(OfferGone, call, detail, "search again and pick another")
        err = self.http.error(ProviderError, call, detail)
        # an HTTP 4xx or `success: false` said no; a 2xx without a result says nothing
        err.refused = resp.status_code >= 400 or body.get("success") is False
        return err

    # -- offers -----------------------------------------------------------------------------

    def offers(
        self,
        card: str | None = None,
        gpu_count: int = 1,
        driver: str | None = None,
        direct_ports: int = 0,
        cuda: tuple[str, ...] = (),
        rocm: tuple[str, ...] = (),
        disk_gb: float | None = None,
    ) -> list[Offer]:
        """Rentable on-demand offers, cheapest first (POST /api/v0/bundles/).

        An AMD card (or `rocm` named) searches AMD hosts: `gpu_arch` amd, `driver` the exact
        amdgpu driver, `rocm` the ROCm lines; never the CUDA filter.

        Vast's `dph_total` counts the disk (`storage_cost` x GB / 720), priced for the
        search's `allocated_storage` (hosts with less disk are left out): `disk_gb`, the disk
        the rent will ask for (`storage_gb` when None), so the price is the one it bills.
        An offer without a `dph_total` is left out and named in `unpriced`.
        """
        q: dict[str, Any] = dict(_DEFAULTS)
        q["num_gpus"] = {"eq": gpu_count}
        if card:
            q["gpu_name"] = {"eq": card}
        amd = bool(rocm) or (card is not None and cards.vendor(card) == cards.AMD)
        if amd:
            q["gpu_arch"] = {"eq": cards.AMD}
        if driver:
            q["driver_version"] = {"eq": driver_code(driver)}
        if direct_ports:
            q["direct_port_count"] = {"gte": direct_ports}
        if amd and rocm:
            q["rocm_version"] = {"in": [float(r) for r in rocm]}
        elif cuda and not amd:
            q["cuda_max_good"] = {"in": [float(c) for c in cuda]}
        storage = self.storage_gb if disk_gb is None else float(disk_gb)
        q.update(order=[["dph_total", "asc"]], type="on-demand", allocated_storage=storage)
        call = "POST /api/v0/bundles/"
        body = self._call("POST", "/api/v0/bundles/", call, json=q, final=_quota_spent)
        out: list[Offer] = []
        unpriced: list[str] = []
        for o in body.get("offers") or []:
            usd = price(o.get("dph_total"))
            if usd is None:
                unpriced.append(str(o.get("id")))
                continue
            out.append(self._offer(o, usd))
        # the server's driver filter is documented as fragile: check the exact string again
        return Offers([o for o in out if (driver is None or o.driver == driver)
                       and (not (amd and rocm) or o.rocm in rocm)], unpriced)

    def _offer(self, o: dict[str, Any], usd_per_hour: float) -> Offer:
        geo = str(o.get("geolocation") or "")
        country = geo.rsplit(",", 1)[-1].strip() if geo else None
        cuda = o.get("cuda_max_good")
        rocm = _number(o.get("rocm_version")) if o.get("gpu_arch") == cards.AMD else None
        return Offer(
            provider=self.name,
            offer_id=str(o["id"]),
            card=str(o.get("gpu_name") or ""),
            gpu_count=int(o.get("num_gpus") or 0),
            usd_per_hour=usd_per_hour,
            driver=o.get("driver_version") or None,
            cuda=str(cuda) if cuda is not None else None,
            rocm=f"{rocm:g}" if rocm is not None else None,
            cloud="datacenter" if o.get("hosting_type") == 1 else "community",
            country=country or None,
            reliability=o.get("reliability2", o.get("reliability")),
            direct_ports=o.get("direct_port_count"),
            stopped_usd_per_gb_month=_number(o.get("storage_cost")),
            machine_id=_text(o.get("machine_id")),
            raw=o,
        )

    # -- rent -------------------------------------------------------------------------------

    def _create(self, offer: Offer, req: RentRequest) -> Box:
        env: dict[str, str] = dict(req.env)
        for port in req.tcp_ports:
            if port != 22:  # the ssh runtype maps 22 itself
                env[f"-p {port}:{port}"] = "1"
        body: dict[str, Any] = {
            "client_id": "me",
            "image": req.image,
            "disk": req.disk_gb + req.volume_gb,
            "label": req.label,
            "env": env,
            "runtype": RUNTYPE,
            "cancel_unavail": True,  # fail now rather than queue for a taken machine
        }
        if req.onstart:
            body["onstart"] = req.onstart
        if req.spot_bid is not None:
            body["price"] = req.spot_bid
        call = f"PUT /api/v0/asks/{offer.offer_id}/"
        resp = self.http.request(
            "PUT", f"/api/v0/asks/{offer.offer_id}/", call=call, json=body, idempotent=False
        )
        answer = self.http.json(resp, call)
        answer = answer if isinstance(answer, dict) else {}
        new = answer.get("new_contract")
        if resp.status_code < 400 and answer.get("success") is not False and new:
            return Box(
                provider=self.name, box_id=str(new), label=req.label, card=offer.card,
                gpu_count=offer.gpu_count,
                usd_per_hour=req.spot_bid if req.spot_bid is not None else offer.usd_per_hour,
                status=BoxStatus.PROVISIONING, driver=offer.driver, raw=answer,
            )
        if new:
            # a refused bid still leaves a stopped instance behind that bills for its disk
            self._saw(str(new))  # on this key's account: the create's answer names it
            self.destroy(str(new))
            raise self.http.error(
                NoCapacity, call,
                f"refused ({_message(answer) or resp.status_code}); "
                f"instance {new} it left behind was destroyed",
                "raise the bid or pick another offer",
            )
        raise self._refusal(call, resp, answer)

    # -- boxes ------------------------------------------------------------------------------

    def _list(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        """Every instance matching `filters`, following next_token page by page."""
        params = {
            "select_filters": json.dumps(filters),
            "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
            "limit": str(PAGE),
        }
        return [row for body in self._pages("/api/v1/instances/", params)
                for row in body.get("instances") or []]

    def _pages(self, path: str, params: dict[str, str]) -> Iterator[dict[str, Any]]:
        """Each page of a GET that Vast pages by `next_token` (keyset: `after_token`)."""
        seen: set[str] = set()
        call = f"GET {path}"
        while True:
            body = self._call("GET", path, call, params=params)
            yield body
            token = body.get("next_token")
            if not token:
                return
            if token in seen:
                raise self.http.error(ProviderError, call, "next_token repeats; listing loops")
            seen.add(token)
            params = {**params, "after_token": str(token)}

    def boxes(self) -> list[Box | Unreadable]:
        return [self._read(i) for i in self._list({})]

    # -- billing ----------------------------------------------------------------------------

    billing_lag_s = 0.0  # the charges read as current (how fresh Vast's are is not documented)

    def charges(self, since: datetime, until: datetime) -> dict[str, float]:
        """USD each instance was charged within [since, until], by instance id:
        `GET /api/v0/charges/` (instance charges: GPU and disk), `CHARGES_PAGE` rows a page,
        paged by `next_token`. Raises ProviderError (AuthFailed, RateLimited) when Vast gives
        no bill, or when its paging loops."""
        params = {"select_filters": json.dumps({
            "day": {"gte": int(since.timestamp()), "lte": int(until.timestamp())},
            "type": {"in": ["instance"]}}), "limit": str(CHARGES_PAGE)}
        out: dict[str, float] = {}
        for body in self._pages("/api/v0/charges/", params):
            for r in body.get("results") or []:
                if not isinstance(r, dict):
                    continue
                source = str(r.get("source") or "")
                if r.get("type") == "instance" and source.startswith("instance-"):
                    box_id = source[len("instance-"):]
                    out[box_id] = out.get(box_id, 0.0) + float(r.get("amount") or 0.0)
        return out

    def _by_label(self, label: str) -> list[Box]:
        # filter here too: a server that ignored select_filters must not hand back strangers
        rows = self._list({"label": {"eq": label}})
        return self._labelled(label, map(self._read, rows), "GET /api/v1/instances/")

    def box(self, box_id: str) -> Box | None:
        call = "GET /api/v0/instances/{id}/"
        body = self._call(
            "GET", f"/api/v0/instances/{box_id}/", call, params={"owner": "me"}, gone_ok=True
        )
        inst = body.get("instances")
        if isinstance(inst, dict):
            return self._readable(inst, call)
        if _gone(body) or ("instances" in body and inst is None):
            return None  # Vast's two ways of saying there is no such instance
        # any other answer says nothing of the box: never read it as gone
        raise self.http.error(ProviderError, call, f"no instance in the answer: "
                              f"{_message(body) or str(body)[:200]}")

    def _box(self, inst: dict[str, Any]) -> Box:
        ports: dict[int, int] = {}
        for key, binds in (inst.get("ports") or {}).items():
            port, _, proto = str(key).partition("/")
            if proto in ("", "tcp") and binds and port.isdigit():
                ports[int(port)] = int(binds[0]["HostPort"])  # HostPort is a string
        public_ip = str(inst.get("public_ipaddr") or "").strip() or None
        ssh_host: str | None
        ssh_port: int | None
        if 22 in ports and public_ip:
            ssh_host, ssh_port = public_ip, ports[22]
        else:
            ssh_host = inst.get("ssh_host") or None
            ssh_port = int(inst["ssh_port"]) if inst.get("ssh_port") else None
        return Box(
            provider=self.name,
            box_id=str(inst["id"]),
            label=str(inst.get("label") or ""),
            card=str(inst.get("gpu_name") or ""),
            gpu_count=int(inst.get("num_gpus") or 0),
            usd_per_hour=price(inst.get("dph_total")) or 0.0,  # 0.0: none listed (`priced`)
            status=status_of(inst),
            driver=inst.get("driver_version") or None,
            ssh_host=ssh_host,
            ssh_port=ssh_port,
            public_ip=public_ip,
            p2p_public_port=p2p_public_port(ports, self.p2p_port),
            ports=ports,
            machine_id=_text(inst.get("machine_id")),
            status_note=_text(inst.get("status_msg")),
            uptime_s=None if (mins := positive(inst.get("uptime_mins"))) is None else 60 * mins,
            raw=inst,
        )

    # -- label / stop / destroy -------------------------------------------------------------

    def set_label(self, box_id: str, label: str) -> None:
        self._call("PUT", f"/api/v0/instances/{box_id}/", "PUT /api/v0/instances/{id}/ label",
                   json={"label": label})

    def stop(self, box_id: str) -> None:
        self._call("PUT", f"/api/v0/instances/{box_id}/", "PUT /api/v0/instances/{id}/ state",
                   json={"state": "stopped"})

    def _terminate(self, box_id: str) -> None:
        call = "DELETE /api/v0/instances/{id}/"
        body = self._call("DELETE", f"/api/v0/instances/{box_id}/", call, gone_ok=True)
        if body.get("success") is False and not _gone(body):
            raise self.http.error(ProviderError, call, _message(body) or "refused")


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _gone(body: dict[str, Any]) -> bool:
    """Vast's ways of saying the instance does not exist (the docs and the API disagree)."""
    return body.get("error") in _GONE_ERRORS


def _message(body: dict[str, Any]) -> str:
    for k in ("msg", "message", "detail", "error"):
        if body.get(k):
            return str(body[k])
    return ""


def _quota_spent(resp: httpx.Response) -> bool:
    """A daily search quota 429 resets at UTC midnight: retrying it only burns requests."""
    return "search_quota_exceeded" in resp.text
