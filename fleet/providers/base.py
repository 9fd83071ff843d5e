"""One model for both providers: what can be rented (Offer) and what is rented (Box)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Protocol

from fleet.core.states import BoxStatus

HOURS_PER_MONTH = 720.0  # how both providers turn a monthly storage price into an hourly one
# RunPod: a stopped pod's volume, USD per GB per month (its docs; the container disk is dropped)
RUNPOD_STOPPED_VOLUME_GB_MONTH = 0.20


def price(value: Any) -> float | None:
    """A provider's price field as USD per hour: a positive, finite number, else None (absent,
    null, zero, text). A rented GPU box is never free: a price that reads as none is unknown,
    never $0 (RunPod has been seen to list `costPerHr` 0)."""
    return positive(value)


def positive(value: Any) -> float | None:
    """A provider's field that only means something above zero (a price, an uptime) as a
    positive, finite number, else None: absent, null, zero, text (RunPod has been seen to
    list `costPerHr` and `uptimeSeconds` 0)."""
    if isinstance(value, bool):
        return None
    try:
        usd = float(value)
    except (TypeError, ValueError):
        return None
    return usd if usd > 0 and math.isfinite(usd) else None


def place_of(provider: str, machine_id: str | None, data_center: str | None) -> str | None:
    """Where a box is, as the spread of a role's boxes counts it: one host failure takes every
    box in one place. Vast names the machine of each offer and instance; RunPod names none an
    offer can choose, so its place is the data center (Secure Cloud only: Community Cloud
    offers name a country at most). None: the provider names no place for it."""
    if provider == "vast" and machine_id:
        return f"vast machine {machine_id}"
    if provider == "runpod" and data_center:
        return f"runpod data center {data_center}"
    return None


@dataclass(frozen=True)
class Offer:
    provider: str  # "runpod" | "vast"
    offer_id: str  # Vast ask id; RunPod GPU type id (+ cloud), what rent() needs to place it
    card: str  # the fleet's card name, e.g. "RTX 4090", "H100 SXM"
    gpu_count: int
    usd_per_hour: float  # live price for the whole box (all GPUs, storage included where known)
    driver: str | None = None  # exact NVIDIA driver string where the provider says (Vast)
    cuda: str | None = None  # highest CUDA the host supports, "12.8"
    rocm: str | None = None  # AMD offers: the ROCm release line the host carries, "6.4"
    cloud: str | None = None  # RunPod: "SECURE" | "COMMUNITY"; Vast: "datacenter" | "community"
    country: str | None = None
    reliability: float | None = None
    direct_ports: int | None = None
    stock: str | None = None  # RunPod stockStatus
    machine_id: str | None = None  # Vast: the host machine the ask is on (RunPod places pods)
    data_center: str | None = None  # RunPod Secure Cloud: the data center a rent asks for
    # what its kept storage costs while the box is stopped, USD per GB per month (None: unknown)
    stopped_usd_per_gb_month: float | None = None
    # found only once no offer mapping the role's p2p port was: its box is owed a port
    portless: bool = False
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def place(self) -> str | None:
        return place_of(self.provider, self.machine_id, self.data_center)

    def stopped_usd_per_hour(self, req: RentRequest) -> float | None:
        """What the box rented for `req` bills while stopped: its storage only. Vast keeps (and
        bills) the one disk; RunPod keeps the volume and drops the container disk."""
        if self.stopped_usd_per_gb_month is None:
            return None
        kept = req.disk_gb + req.volume_gb if self.provider == "vast" else req.volume_gb
        return self.stopped_usd_per_gb_month * kept / HOURS_PER_MONTH


class Offers(list[Offer]):
    """A provider's offers (a list of them), with the ids of the offers it listed without a
    price (`unpriced`): those are left out, never rented (a box with no price would count as
    free in the budget), and said beside the offers (`fleet.ops.offers.search`)."""

    def __init__(self, offers: Iterable[Offer] = (), unpriced: Iterable[str] = ()) -> None:
        super().__init__(offers)
        self.unpriced = tuple(unpriced)


@dataclass
class Box:
    provider: str
    box_id: str  # provider's id: RunPod pod id, Vast instance id (as text)
    label: str  # the fleet's unique label (RunPod: pod name; Vast: label)
    card: str
    gpu_count: int
    # its price from the provider's listing; 0.0 where the listing names none (`priced`)
    usd_per_hour: float
    # mapped at its provider's edge: provisioning, running, stopped, exited or unknown (gone:
    # a box its provider no longer has, where its row last saw it)
    status: BoxStatus
    driver: str | None = None
    ssh_host: str | None = None
    ssh_port: int | None = None
    public_ip: str | None = None
    p2p_public_port: int | None = None
    ports: dict[int, int] = field(default_factory=dict)  # internal TCP port -> public port
    machine_id: str | None = None  # the host machine it runs on, where the provider says
    data_center: str | None = None  # RunPod: the data center (Secure Cloud) it runs in
    # the provider's own words on the status (Vast: status_msg; RunPod: lastStatusChange)
    status_note: str | None = None
    # seconds since its container last (re)started, as its provider lists it; None where it
    # lists none (RunPod's 0 is a known bug, never "just restarted"): a changed host key is
    # re-pinned only on this word (`fleet.ops.judgement.repin_refusal`); a reading of the
    # moment, so no part of what makes two listings of a box the same
    uptime_s: float | None = field(default=None, compare=False)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.status = BoxStatus(self.status)

    @property
    def place(self) -> str | None:
        return place_of(self.provider, self.machine_id, self.data_center)

    @property
    def priced(self) -> bool:
        """Whether its provider lists a price for it: a box without one reads 0.0, which is
        no price, never a free box (the budget refuses to count it as one)."""
        return price(self.usd_per_hour) is not None

    def rate(self) -> str:
        """Its price as said to people: `$0.300/h`, or `price unknown` (never `$0.000/h`)."""
        return f"${self.usd_per_hour:.3f}/h" if self.priced else "price unknown"

    @property
    def ssh_ready(self) -> bool:
        return self.status == BoxStatus.RUNNING and bool(self.ssh_host) and bool(self.ssh_port)

    def p2p_endpoint(self, known: tuple[str | None, int | None]) -> tuple[str | None, int | None]:
        """The box's public p2p endpoint (ip, port): what the listing maps, else what is
        `known`. A listing without a mapping proves nothing (Vast lists running boxes with
        `ports` null for minutes): a mapping that truly went is found by the nodes that no
        longer reach it (`fleet.ops.ports`)."""
        return self.public_ip or known[0], self.p2p_public_port or known[1]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("raw")
        return d


@dataclass(frozen=True)
class Unreadable:
    """A row of a provider's listing that its client could not read (a field missing or of
    another shape): what could be read of it, and why not the rest. Never a box's death and
    never an orphan: the rows it may be are not judged while it stays unreadable."""

    provider: str
    box_id: str | None
    label: str | None
    why: str
    usd_per_hour: float | None = None  # its price, where that field still reads

    def __str__(self) -> str:
        box = f"{self.provider}/{self.box_id}" if self.box_id else f"a {self.provider} box"
        return f"{self.label or 'unlabelled'} ({box}): its listing row is unreadable ({self.why})"


@dataclass(frozen=True)
class RentRequest:
    label: str  # unique; the idempotency key
    image: str
    disk_gb: int
    tcp_ports: tuple[int, ...] = (22,)  # internal ports to expose; the p2p port among them
    env: dict[str, str] = field(default_factory=dict)
    onstart: str | None = None  # start hook (Vast onstart; RunPod: passed as dockerArgs script)
    allowed_cuda: tuple[str, ...] = ()
    spot_bid: float | None = None  # per box per hour; None = on-demand
    volume_gb: int = 0  # RunPod: a pod volume that survives a stop; Vast: added to the one disk
    volume_path: str | None = None  # RunPod: where the volume is mounted (default /workspace)


class Provider(Protocol):
    name: str

    def offers(
        self,
        card: str | None = None,
        gpu_count: int = 1,
        driver: str | None = None,
        direct_ports: int = 0,
        cuda: tuple[str, ...] = (),  # host CUDA versions allowed ("12.8"); () = any
        rocm: tuple[str, ...] = (),  # AMD: host ROCm release lines allowed ("6.4"); () = any
        # GB of storage the rent will ask for (container disk + volume): a provider whose
        # price counts the disk prices its offers for it (Vast); None: its own default
        disk_gb: float | None = None,
    ) -> list[Offer]: ...

    def rent(self, offer: Offer, req: RentRequest) -> Box: ...

    # every box on the account; a row the client cannot read is an Unreadable, in its place
    def boxes(self) -> Sequence[Box | Unreadable]: ...

    def box(self, box_id: str) -> Box | None: ...

    def find_by_label(self, label: str) -> Box | None: ...

    def stop(self, box_id: str) -> None: ...

    def destroy(self, box_id: str) -> None: ...

    # seconds the provider's bill lags its meters: `charges` counts up to `until` minus this
    billing_lag_s: float

    def charges(self, since: datetime, until: datetime) -> dict[str, float]:
        """USD the provider charged each box within [since, until], by box id (its bill,
        GPU and storage); boxes it charged nothing there are absent. Raises ProviderError
        when it gives no bill."""
        ...


def oldest_first(box: Box) -> tuple[int, str]:
    """Sort key: Vast's numeric ids by number (oldest first); RunPod's by text."""
    return (len(box.box_id), box.box_id)
