"""RunPod through its GraphQL API (`$RUNPOD_API_BASE_URL/graphql`).

Business errors come back as HTTP 200 with an `errors` list; capacity is recognised by its
message ("no longer any instances available"). RunPod has no label field: the pod name is the
label. It has no driver field either: offers carry driver=None and admission after boot guards.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from fleet.core import cards
from fleet.core.errors import AuthFailed, NoCapacity, ProviderError
from fleet.core.states import BoxStatus
from fleet.core.times import utc_day_start
from fleet.providers.base import (
    RUNPOD_STOPPED_VOLUME_GB_MONTH,
    Box,
    Offer,
    Offers,
    RentRequest,
    Unreadable,
    positive,
    price,
)
from fleet.providers.client import Client, p2p_public_port
from fleet.providers.gql import Enum, literal, operation

DEFAULT_BASE_URL = "https://api.runpod.io"
DEFAULT_REST_URL = "https://rest.runpod.io"

_CAPACITY = ("no longer any instances available", "not enough free gpus")
_GONE = ("not found", "does not exist")

POD_FIELDS = (
    "id name desiredStatus costPerHr adjustedCostPerHr gpuCount imageName lastStatusChange "
    "uptimeSeconds ports "
    "machineId "
    "runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type } } "
    "machine { gpuDisplayName podHostId dataCenterId }"
)
# Secure Cloud types asked per data center, cheapest first (a rent names its card: one)
PER_CENTRE_TYPES = 3
_PRICE_FIELDS = "minimumBidPrice uninterruptablePrice stockStatus maxUnreservedGpuCount"

# desiredStatus -> the fleet's status. RUNNING and EXITED need more (see `status_of`).
_STATUS = {
    "CREATED": BoxStatus.PROVISIONING,
    "RESTARTING": BoxStatus.PROVISIONING,
    "PAUSED": BoxStatus.STOPPED,
    "DEAD": BoxStatus.EXITED,
    "TERMINATED": BoxStatus.EXITED,
}
# lastStatusChange text of a host RunPod lost contact with ("Host machine is unreachable: ...")
_HOST_TROUBLE = ("unreachable", "offline", "lost contact", "host down")


def status_of(pod: dict[str, Any], ssh_published: bool) -> BoxStatus:
    """desiredStatus, refined by runtime and lastStatusChange, as the fleet's status.

    RUNNING: "running" once SSH is published; without a runtime it is still booting, unless
    lastStatusChange says the host is gone (desiredStatus stays RUNNING on host death).
    EXITED: "stopped" when the user stopped it, else "exited" (spot reclaim, crash).
    """
    desired = str(pod.get("desiredStatus") or "")
    change = str(pod.get("lastStatusChange") or "").lower()
    if desired == "RUNNING":
        if ssh_published:
            return BoxStatus.RUNNING
        return BoxStatus.UNKNOWN if any(s in change for s in _HOST_TROUBLE) \
            else BoxStatus.PROVISIONING
    if desired == "EXITED":
        return BoxStatus.STOPPED if "by user" in change else BoxStatus.EXITED
    return _STATUS.get(desired, BoxStatus.UNKNOWN)


def _lowest(t: dict[str, Any]) -> float | None:
    """A GPU type's on-demand price per GPU from its `lowestPrice`, or None where none reads."""
    return price((t.get("lowestPrice") or {}).get("uninterruptablePrice"))


def base_url() -> str:
    return os.environ.get("RUNPOD_API_BASE_URL") or DEFAULT_BASE_URL


def _rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def rest_url() -> str:
    """RunPod's REST v2 host (billing lives there, not beside GraphQL)."""
    return (os.environ.get("RUNPOD_REST_URL") or DEFAULT_REST_URL).rstrip("/")


class RunPod(Client):
    """The RunPod GraphQL client. See `Client` for rent and destroy semantics."""

    name = "runpod"
    label_field = "name"  # a pod's label is its name
    price_field = "costPerHr"

    # -- GraphQL plumbing -------------------------------------------------------------------

    def _gql(self, call: str, document: str, *, idempotent: bool = True) -> dict[str, Any]:
        resp = self.http.request(
            "POST", "/graphql", call=call, json={"query": document}, idempotent=idempotent
        )
        body = self.http.json(resp, call)
        if not isinstance(body, dict):
            snippet = self.http.body_snippet(resp)
            raise self.http.error(ProviderError, call, f"unexpected body: {snippet}")
        if body.get("errors"):
            err = self._gql_error(call, body["errors"])
            # errors beside a result (GraphQL's partial answer) may come with a pod made
            data = body.get("data")
            err.refused = not (isinstance(data, dict) and data.get(call))
            raise err
        if resp.status_code >= 400:
            err = self.http.error(
                ProviderError, call, f"HTTP {resp.status_code}: {self.http.body_snippet(resp)}"
            )
            err.refused = True  # a 4xx (a 5xx was OutcomeUnknown or retried in `Http`)
            raise err
        data = body.get("data")
        return data if isinstance(data, dict) else {}

    def _gql_error(self, call: str, errors: Any) -> ProviderError:
        msgs = [str(e.get("message", e)) if isinstance(e, dict) else str(e) for e in errors]
        text = "; ".join(msgs) or "unspecified GraphQL error"
        low = text.lower()
        if any(s in low for s in _CAPACITY):
            return self.http.error(NoCapacity, call, text, "try another offer, or later")
        if "unauthorized" in low or "api key" in low:
            return self.http.error(AuthFailed, call, text, "check RUNPOD_API_KEY")
        return self.http.error(ProviderError, call, text)

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
        """On-demand offers per GPU type and cloud, from `gpuTypes { lowestPrice }`; Secure
        Cloud offers per data center where RunPod lists them (`dataCenters`), so a rent can
        ask for one (`dataCenterId`) and the spread can count it.

        RunPod cannot filter on a driver (`driver` is accepted and ignored: admission after
        boot guards); `cuda` becomes `allowedCudaVersions`. AMD types (`manufacturer` "AMD",
        gpuTypeId "AMD Instinct MI300X OAM") have no CUDA: a search for an AMD card sends no
        CUDA filter, and `rocm` is accepted and ignored (RunPod names no ROCm filter). Types
        whose stock is null are dropped, as RunPod has nothing to place them on; a type in
        stock without a price is left out and named in `unpriced`. `disk_gb` is accepted and
        ignored:
        RunPod's price is per GPU and leaves storage out, in the offer as in the pod's
        `costPerHr`, so the disk does not change the price a rent is checked at.
        """
        out: list[Offer] = []
        unpriced: list[str] = []
        type_filter = {"input": {"id": cards.runpod_type_id(card)}} if card else None
        amd = card is not None and cards.vendor(card) == cards.AMD
        for cloud in ("SECURE", "COMMUNITY"):
            price_in: dict[str, Any] = {"gpuCount": gpu_count, "secureCloud": cloud == "SECURE"}
            if cuda and not amd:
                price_in["allowedCudaVersions"] = list(cuda)
            if direct_ports and cloud == "COMMUNITY":
                price_in["supportPublicIp"] = True  # Secure Cloud always has a public IP
            doc = operation(
                "query", "gpuTypes", type_filter,
                f"id displayName memoryInGb secureCloud communityCloud "
                f"lowestPrice(input: {literal(price_in)}) {{ {_PRICE_FIELDS} }}",
            )
            types = self._gql("gpuTypes", doc).get("gpuTypes") or []
            placed = self._per_centre(types, price_in, gpu_count, unpriced) \
                if cloud == "SECURE" else {}
            for t in types:
                offer = self._offer(t, cloud, gpu_count, unpriced=unpriced)
                if offer is not None:
                    out.extend(placed.get(t["id"]) or [offer])
        out.sort(key=lambda o: (o.usd_per_hour, o.offer_id))
        return Offers(out, unpriced)

    def _per_centre(self, types: list[dict[str, Any]], price_in: dict[str, Any],
                    gpu_count: int, unpriced: list[str]) -> dict[str, list[Offer]]:
        """Secure Cloud offers per data center, by type id, for the cheapest `PER_CENTRE_TYPES`
        types in stock: the listed data centers (root `dataCenters`; a type's own
        `nodeGroupDatacenters` is known to come back empty), then one query per type with a
        `lowestPrice(dataCenterId)` per data center, aliased. Where RunPod refuses either,
        the offers stay as they were, naming no data center: a rent still works, unspread."""
        stocked = sorted((t for t in types if t.get("secureCloud") is not False
                          and _lowest(t) is not None
                          and (t.get("lowestPrice") or {}).get("stockStatus")),
                         key=lambda t: _lowest(t) or 0.0)
        if not stocked:
            return {}
        out: dict[str, list[Offer]] = {}
        try:
            listed = self._gql("dataCenters", operation("query", "dataCenters", None,
                                                         "id listed")).get("dataCenters")
            centres = sorted({str(c["id"]) for c in listed or [] if isinstance(c, dict)
                              and c.get("id") and c.get("listed") is not False})
            for t in stocked[:PER_CENTRE_TYPES] if centres else []:
                fields = " ".join(
                    f"dc{i}: lowestPrice(input: {literal(price_in | {'dataCenterId': c})}) "
                    f"{{ {_PRICE_FIELDS} }}" for i, c in enumerate(centres))
                doc = operation("query", "gpuTypes", {"input": {"id": t["id"]}},
                                f"id secureCloud {fields}")
                for got in self._gql("gpuTypes", doc).get("gpuTypes") or []:
                    for i, c in enumerate(centres):
                        offer = self._offer(got | {"lowestPrice": got.get(f"dc{i}")}, "SECURE",
                                            gpu_count, centre=c, unpriced=unpriced)
                        if offer is not None:
                            out.setdefault(str(got["id"]), []).append(offer)
        except ProviderError:
            return {}
        return out

    def _offer(self, t: dict[str, Any], cloud: str, gpu_count: int,
               centre: str | None = None, unpriced: list[str] | None = None) -> Offer | None:
        """The offer of GPU type `t` in `cloud` (and `centre`); None where it offers none:
        not in that cloud, out of stock, or in stock without a price (its id then added to
        `unpriced`: never rented, as its box would count as free)."""
        flag = "secureCloud" if cloud == "SECURE" else "communityCloud"
        lp = t.get("lowestPrice") or {}
        if t.get(flag) is False or not lp.get("stockStatus"):
            return None
        type_id = t["id"]
        offer_id = f"{type_id}:{cloud}" + (f":{centre}" if centre else "")
        usd = _lowest(t)
        if usd is None:
            if unpriced is not None:
                unpriced.append(offer_id)
            return None
        return Offer(
            provider=self.name,
            offer_id=offer_id,
            card=cards.from_runpod(type_id), gpu_count=gpu_count,
            usd_per_hour=round(usd * gpu_count, 6), cloud=cloud,
            stock=lp.get("stockStatus"), data_center=centre,
            stopped_usd_per_gb_month=RUNPOD_STOPPED_VOLUME_GB_MONTH, raw=t,
        )

    # -- rent -------------------------------------------------------------------------------

    def _create(self, offer: Offer, req: RentRequest) -> Box:
        spot = req.spot_bid is not None
        field = "podRentInterruptable" if spot else "podFindAndDeployOnDemand"
        inp: dict[str, Any] = {
            "name": req.label,
            "imageName": req.image,
            "gpuTypeId": cards.runpod_type_id(offer.card),
            "gpuCount": offer.gpu_count,
            "cloudType": Enum(offer.cloud or "ALL"),
            "containerDiskInGb": req.disk_gb,
            "volumeInGb": req.volume_gb,
            "ports": ",".join(f"{p}/tcp" for p in req.tcp_ports),
            "env": [{"key": k, "value": v} for k, v in req.env.items()],
            "supportPublicIp": True,
            "startSsh": True,
        }
        if offer.data_center:
            inp["dataCenterId"] = offer.data_center
        if req.volume_gb:
            inp["volumeMountPath"] = req.volume_path or "/workspace"
        # an AMD pod has no CUDA: a CUDA filter would leave it nowhere to be placed
        if req.allowed_cuda and cards.vendor(offer.card) != cards.AMD:
            inp["allowedCudaVersions"] = list(req.allowed_cuda)
        if req.onstart:
            inp["dockerArgs"] = req.onstart
        if spot:
            assert req.spot_bid is not None
            inp["bidPerGpu"] = round(req.spot_bid / offer.gpu_count, 6)
        doc = operation(
            "mutation", field, {"input": inp},
            "id imageName env machineId desiredStatus machine { podHostId }",
        )
        pod = self._gql(field, doc, idempotent=False).get(field)
        if not isinstance(pod, dict) or not pod.get("id"):
            raise self.http.error(ProviderError, field, "no pod in the answer")
        return Box(
            provider=self.name, box_id=str(pod["id"]), label=req.label, card=offer.card,
            gpu_count=offer.gpu_count,
            usd_per_hour=req.spot_bid if spot and req.spot_bid else offer.usd_per_hour,
            status=BoxStatus.PROVISIONING, raw=pod,
        )

    # -- boxes ------------------------------------------------------------------------------

    def boxes(self) -> list[Box | Unreadable]:
        doc = operation("query", "myself", None, f"pods {{ {POD_FIELDS} }}")
        data = self._gql("myself.pods", doc)
        pods = (data.get("myself") or {}).get("pods") or []
        return [self._read(p) for p in pods]

    def _by_label(self, label: str) -> list[Box]:
        return self._labelled(label, self.boxes(), "myself.pods")

    def box(self, box_id: str) -> Box | None:
        doc = operation("query", "pod", {"input": {"podId": box_id}}, POD_FIELDS)
        try:
            data = self._gql("pod", doc)
        except ProviderError as e:
            if type(e) is ProviderError and any(s in e.detail.lower() for s in _GONE):
                return None
            raise
        if "pod" not in data:  # an answer that says nothing of the pod: never "gone"
            raise self.http.error(ProviderError, "pod", "no pod field in the answer")
        pod = data["pod"]
        if isinstance(pod, dict) and pod.get("desiredStatus") == "TERMINATED":
            if pod.get("id"):
                self._saw(str(pod["id"]))  # shown to this key: its account's, and gone
            return None
        if not pod:
            return None
        return self._readable(pod, "pod")

    def _box(self, pod: dict[str, Any]) -> Box:
        runtime = pod.get("runtime") or {}
        ports: dict[int, int] = {}
        public_ip: str | None = None
        for p in runtime.get("ports") or []:
            if p.get("type") != "tcp" or not p.get("isIpPublic"):
                continue  # http ports sit behind RunPod's proxy, unusable for SSH or p2p
            if p.get("privatePort") is None or p.get("publicPort") is None:
                continue
            ports[int(p["privatePort"])] = int(p["publicPort"])
            public_ip = public_ip or p.get("ip") or None
        machine = pod.get("machine") or {}
        return Box(
            provider=self.name,
            box_id=str(pod["id"]),
            label=str(pod.get("name") or ""),
            card=cards.from_runpod(machine.get("gpuDisplayName")),
            gpu_count=int(pod.get("gpuCount") or 0),
            # compute, no storage; after savings plans where only that is listed; 0.0: none
            usd_per_hour=price(pod.get("costPerHr")) or price(pod.get("adjustedCostPerHr"))
            or 0.0,
            status=status_of(pod, 22 in ports),
            ssh_host=public_ip if 22 in ports else None,
            ssh_port=ports.get(22),
            public_ip=public_ip,
            p2p_public_port=p2p_public_port(ports, self.p2p_port),
            ports=ports,
            machine_id=str(pod["machineId"]) if pod.get("machineId") else None,
            data_center=str(machine["dataCenterId"]) if machine.get("dataCenterId") else None,
            status_note=str(pod["lastStatusChange"]) if pod.get("lastStatusChange") else None,
            uptime_s=positive(runtime.get("uptimeInSeconds")),
            raw=pod,
        )

    # -- stop / destroy ---------------------------------------------------------------------

    def stop(self, box_id: str) -> None:
        doc = operation("mutation", "podStop", {"input": {"podId": box_id}}, "id desiredStatus")
        self._gql("podStop", doc)

    def _terminate(self, box_id: str) -> None:
        doc = operation("mutation", "podTerminate", {"input": {"podId": box_id}})
        try:
            self._gql("podTerminate", doc)
        except ProviderError as e:
            # "pod not found to terminate": already gone, which is what we wanted
            if type(e) is not ProviderError or not any(s in e.detail.lower() for s in _GONE):
                raise

    # -- billing ----------------------------------------------------------------------------

    billing_lag_s = 300.0  # RunPod bills every 5 minutes: its latest minutes are not billed yet

    def charges(self, since: datetime, until: datetime) -> dict[str, float]:
        """USD each pod was charged from `since` until `until` (exclusive), by pod id: REST v2
        `GET /v2/billing/pods` on `RUNPOD_REST_URL`, GPU, CPU and disk, the records of every
        bucket summed. Day buckets when `since` is a UTC midnight, else hour buckets: RunPod
        snaps `since` down to its bucket's start. The bill lags `billing_lag_s` behind.
        Raises ProviderError (AuthFailed, RateLimited) when RunPod gives no bill."""
        call = "GET /v2/billing/pods"
        since, until = since.astimezone(UTC), until.astimezone(UTC)
        day = since == utc_day_start(since)
        params = {"startTime": _rfc3339(since), "endTime": _rfc3339(until),
                  "bucketSize": "day" if day else "hour"}
        resp = self.http.request("GET", f"{rest_url()}/v2/billing/pods", call=call,
                                 params=params)
        if resp.status_code >= 400:
            raise self.http.error(ProviderError, call, f"HTTP {resp.status_code}: "
                                  f"{self.http.body_snippet(resp)}")
        body = self.http.json(resp, call)
        records = body.get("records") if isinstance(body, dict) else None
        if not isinstance(records, list):
            raise self.http.error(ProviderError, call,
                                  f"no records in the answer: {self.http.body_snippet(resp)}")
        out: dict[str, float] = {}
        for r in records:
            pod = str(r.get("podId") or "") if isinstance(r, dict) else ""
            if pod:
                out[pod] = out.get(pod, 0.0) + float(r.get("totalAmount") or 0.0)
        return out
