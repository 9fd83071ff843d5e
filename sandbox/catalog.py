"""The sandbox world's fixed catalog: cards, drivers, places, and the seeded machine generator.

Names follow each provider's own spelling: RunPod's `gpuTypeId`/`displayName`, Vast's
`gpu_name` (with spaces), NVML's device name. Prices are per GPU per hour.
"""

from __future__ import annotations

import random
import string
import uuid
from dataclasses import dataclass, field

from sandbox.backend import GpuDevice


@dataclass(frozen=True)
class Card:
    runpod_id: str  # RunPod gpuTypeId
    display: str  # RunPod displayName; also the fleet's card name
    vast_name: str  # Vast gpu_name
    nvml_name: str  # what nvmlDeviceGetName answers
    memory_gb: int
    compute_cap: int  # Vast's compute_cap (890 = sm_89)
    tflops: float  # Vast total_flops per GPU
    secure_price: float  # RunPod Secure Cloud on-demand, per GPU
    community_price: float  # RunPod Community Cloud on-demand, per GPU
    vast_price: float  # Vast median dph_base per GPU; machines vary around it
    datacenter_card: bool  # only these have an NVML serial number
    weight: int  # how common the card is in the world
    vendor: str = "nvidia"  # "amd": its box answers through the stand-in AMD SMI


CARDS: tuple[Card, ...] = (
    Card("NVIDIA GeForce RTX 4090", "RTX 4090", "RTX 4090", "NVIDIA GeForce RTX 4090",
         24, 890, 82.6, 0.69, 0.34, 0.35, False, 6),
    Card("NVIDIA GeForce RTX 3090", "RTX 3090", "RTX 3090", "NVIDIA GeForce RTX 3090",
         24, 860, 35.6, 0.43, 0.22, 0.18, False, 3),
    Card("NVIDIA RTX A6000", "RTX A6000", "RTX A6000", "NVIDIA RTX A6000",
         48, 860, 38.7, 0.49, 0.33, 0.40, True, 2),
    Card("NVIDIA L40S", "L40S", "L40S", "NVIDIA L40S",
         48, 890, 91.6, 0.86, 0.79, 0.55, True, 2),
    Card("NVIDIA A100-SXM4-80GB", "A100 SXM", "A100 SXM4", "NVIDIA A100-SXM4-80GB",
         80, 800, 19.5, 1.49, 1.19, 0.85, True, 2),
    Card("NVIDIA H100 80GB HBM3", "H100 SXM", "H100 SXM", "NVIDIA H100 80GB HBM3",
         80, 900, 66.9, 2.69, 2.39, 1.90, True, 3),
)

# AMD cards: machines of their own, drawn after the NVIDIA ones from a stream of their own, so
# a seed's NVIDIA machines stay as they were. nvml_name is what amdsmi's market name answers.
RX_7900_XTX = Card("AMD Radeon RX 7900 XTX", "RX 7900 XTX", "RX 7900 XTX",
                   "AMD Radeon RX 7900 XTX", 24, 0, 61.4, 0.69, 0.39, 0.32, False, 0, "amd")
MI300X = Card("AMD Instinct MI300X OAM", "MI300X", "MI300X", "AMD Instinct MI300X",
              192, 0, 163.4, 2.99, 2.49, 1.95, True, 0, "amd")
AMD_CARDS: tuple[Card, ...] = (RX_7900_XTX, MI300X)
# per provider, the AMD machines of the world: (card, GPUs); the first of each card carries the
# majority driver, so every seed offers each card on it
AMD_MACHINES: dict[str, tuple[tuple[Card, int], ...]] = {
    "vast": ((RX_7900_XTX, 2), (MI300X, 8), (RX_7900_XTX, 4), (MI300X, 8)),
    "runpod": ((MI300X, 8), (MI300X, 8)),
}
ALL_CARDS = CARDS + AMD_CARDS
CARDS_BY_RUNPOD_ID = {c.runpod_id: c for c in ALL_CARDS}

# Driver string -> the CUDA version it supports (what RunPod's machineSystem and Vast's
# cuda_max_good report). 580.95.05 is the majority, as on the real market.
DRIVER_CUDA: dict[str, str] = {
    "580.95.05": "13.0",
    "580.82.07": "13.0",
    "575.64.03": "12.9",
    "575.57.08": "12.9",
    "570.172.08": "12.8",
    "570.195.03": "12.8",
    # not placed on any machine: drifts (the driver_drift fault) and one-shot admission tests
    # reach them, as the operators met them: a point release off the admitted one, a new branch
    "580.105.08": "13.0",
    "595.71.05": "13.2",
}
# A driver branch's CUDA version, for drivers outside the table above (a drift to "570.86.10").
BRANCH_CUDA: dict[int, str] = {
    595: "13.2", 590: "13.1", 580: "13.0", 575: "12.9", 570: "12.8", 565: "12.7", 560: "12.6",
    555: "12.5", 550: "12.4", 545: "12.3", 535: "12.2", 530: "12.1", 525: "12.0",
}
DRIVER_WEIGHTS: tuple[tuple[str, int], ...] = (
    ("580.95.05", 12), ("575.64.03", 3), ("570.172.08", 3), ("570.195.03", 2),
)
# Driver drift stays on the branch (same CUDA), which is exactly what a CUDA filter can't see.
DRIFT_SIBLING: dict[str, str] = {
    "580.95.05": "580.82.07", "580.82.07": "580.95.05",
    "575.64.03": "575.57.08", "575.57.08": "575.64.03",
    "570.172.08": "570.195.03", "570.195.03": "570.172.08",
}

# amdgpu driver (as amdsmi_get_gpu_driver_info answers it) -> the ROCm release installed with
# it. 6.12.12 with ROCm 6.4.1 is the majority.
AMDGPU_ROCM: dict[str, str] = {
    "6.12.12": "6.4.1",
    "6.12.10": "6.4.1",  # a sibling on the same ROCm release: what a ROCm filter can't see
    "6.10.5": "6.3.3",
    "6.8.5": "6.2.4",
}
AMDGPU_WEIGHTS: tuple[tuple[str, int], ...] = (("6.12.12", 6), ("6.10.5", 2), ("6.8.5", 1))
AMDGPU_MAJORITY = "6.12.12"
AMD_DRIFT_SIBLING: dict[str, str] = {"6.12.12": "6.12.10", "6.12.10": "6.12.12",
                                     "6.10.5": "6.10.3", "6.8.5": "6.8.3"}

# RunPod Secure Cloud data centres (id -> country); Community Cloud is addressed by country.
RUNPOD_DATACENTERS: dict[str, str] = {
    "EU-RO-1": "RO", "US-TX-3": "US", "CA-MTL-1": "CA", "EU-SE-1": "SE", "US-GA-1": "US",
}
RUNPOD_COMMUNITY_COUNTRIES = ("US", "CA", "NL", "DE", "PL", "SE")
# Vast geolocation strings end in the two-letter country code.
VAST_PLACES = (
    "Texas, US", "California, US", "Quebec, CA", "Netherlands, NL", "Bavaria, DE",
    "Mazovia, PL", "Stockholm, SE", "Bucharest, RO",
)
COUNTRY_CODES = sorted({p[-2:] for p in VAST_PLACES} | set(RUNPOD_COMMUNITY_COUNTRIES))
GPU_COUNTS: tuple[tuple[int, int], ...] = ((1, 4), (2, 3), (4, 3), (8, 2))
PCI_BUSES = (0x1B, 0x1C, 0x3D, 0x3E, 0x9F, 0xA0, 0xBB, 0xBC)


def driver_number(driver: str) -> int:
    """Vast's integer form of a driver string, as its CLI sends it: 535.86.05 -> 535086005."""
    major, minor, patch = driver.split(".")
    return int(f"{int(major):03d}{int(minor):03d}{int(patch):03d}")


def cuda_for(driver: str) -> str:
    """The CUDA version a driver supports; ValueError for a malformed or unknown branch."""
    if driver in DRIVER_CUDA:
        return DRIVER_CUDA[driver]
    driver_number(driver)  # X.Y.Z or ValueError
    branch = int(driver.split(".")[0])
    if branch not in BRANCH_CUDA:
        raise ValueError(f"driver {driver!r}: unknown branch {branch}")
    return BRANCH_CUDA[branch]


def rocm_for(amdgpu: str) -> str:
    """The ROCm release an amdgpu driver came with; for one outside the table, the release of
    its branch's first listed driver (a drift stays on its ROCm release). ValueError for a
    malformed driver or an unknown branch."""
    if amdgpu in AMDGPU_ROCM:
        return AMDGPU_ROCM[amdgpu]
    driver_number(amdgpu)  # X.Y.Z or ValueError
    branch = amdgpu.rsplit(".", 1)[0]
    for known, rocm in AMDGPU_ROCM.items():
        if known.rsplit(".", 1)[0] == branch:
            return rocm
    raise ValueError(f"amdgpu driver {amdgpu!r}: unknown branch {branch}")


def known_driver(driver: str) -> None:
    """ValueError unless `driver` is an NVIDIA driver of a known branch or an amdgpu one."""
    try:
        cuda_for(driver)
    except ValueError:
        rocm_for(driver)


def rocm_line(rocm: str) -> str:
    """A ROCm release's line, as offers are filtered by it: "6.4.1" -> "6.4"."""
    return ".".join(rocm.split(".")[:2])


def cuda_int(cuda: str) -> int:
    """NVML's integer CUDA driver version: "12.8" -> 12080."""
    major, minor = cuda.split(".")
    return int(major) * 1000 + int(minor) * 10


def public_ip(n: int) -> str:
    """The n-th machine's address: 10.77.1.<n> for the first 254, then 10.77.2.x and on."""
    block, host = divmod(n - 1, 254)
    return f"10.77.{1 + block}.{host + 1}"


@dataclass
class Machine:
    provider: str  # "runpod" | "vast"
    index: int  # global index across providers; the public IP is derived from it
    machine_id: str  # RunPod: 12 chars like "hpvdausak8xb"; Vast: a number as text
    host_id: int
    card: Card
    gpus: list[GpuDevice]
    price: float  # per GPU per hour (RunPod: the cloud's catalog price)
    driver: str  # what the provider advertises
    actual_driver: str  # what NVML on the box reports (differs after driver drift)
    reliability: float
    direct_port_count: int
    country: str
    datacenter: bool  # RunPod Secure Cloud / Vast hosting_type 1
    location: str  # RunPod data-centre id or country; Vast geolocation string
    public_ip: str
    cpu_cores: int
    ram_gb: int
    disk_gb: int
    inet_down: float
    inet_up: float
    owners: list[str | None] = field(default_factory=list)  # per GPU: instance key or None
    dead_at: float | None = None  # host death time
    # the provider lost the host's heartbeat while its boxes run on (fault heartbeat_lost)
    silent: bool = False

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def vendor(self) -> str:
        return self.card.vendor

    @property
    def cuda(self) -> str:
        """The CUDA version the advertised driver supports; "" on an AMD machine."""
        return "" if self.vendor == "amd" else cuda_for(self.driver)

    @property
    def rocm(self) -> str:
        """The ROCm release the advertised amdgpu driver came with; "" on an NVIDIA machine."""
        return rocm_for(self.driver) if self.vendor == "amd" else ""

    @property
    def free_gpus(self) -> int:
        return 0 if self.dead_at is not None else self.owners.count(None)


def _weighted(rng: random.Random, pairs: tuple[tuple[str, int], ...] | tuple[tuple[int, int], ...]):
    values, weights = zip(*pairs, strict=True)
    return rng.choices(values, weights=weights)[0]


def _uuid(rng: random.Random, card: Card) -> str:
    """NVML's "GPU-<uuid4>"; amdsmi answers a bare uuid whose first bytes are the ASIC's."""
    drawn = uuid.UUID(int=rng.getrandbits(128), version=4)
    if card.vendor == "amd":
        return f"{rng.randrange(256):02x}ff74a1-0000-1000-80{str(drawn)[21:]}"
    return f"GPU-{drawn}"


def _gpus(rng: random.Random, card: Card, count: int) -> list[GpuDevice]:
    serial_base = rng.randrange(1_320_000_000_000, 1_660_000_000_000)
    return [
        GpuDevice(
            uuid=_uuid(rng, card),
            name=card.nvml_name,
            pci_bus_id=f"00000000:{PCI_BUSES[i]:02X}:00.0",
            memory_total=card.memory_gb * 1024**3,
            serial=str(serial_base + i) if card.datacenter_card else None,
        )
        for i in range(count)
    ]


def make_machine(rng: random.Random, provider: str, index: int) -> Machine:
    """One machine, drawn from `rng`; the same seed and index give the same machine."""
    card = rng.choices(CARDS, weights=[c.weight for c in CARDS])[0]
    count = int(_weighted(rng, GPU_COUNTS))
    driver = str(_weighted(rng, DRIVER_WEIGHTS))
    return _machine(rng, provider, index, card, count, driver)


def make_amd_machines(rng: random.Random, provider: str, first_index: int) -> list[Machine]:
    """The provider's AMD machines (`AMD_MACHINES`), indexed from `first_index`."""
    out: list[Machine] = []
    for card, count in AMD_MACHINES[provider]:
        first = all(m.card is not card for m in out)
        driver = AMDGPU_MAJORITY if first else str(_weighted(rng, AMDGPU_WEIGHTS))
        out.append(_machine(rng, provider, first_index + len(out), card, count, driver))
    return out


def _machine(rng: random.Random, provider: str, index: int, card: Card, count: int,
             driver: str) -> Machine:
    datacenter = rng.random() < (0.5 if provider == "runpod" else 0.4)
    if provider == "runpod":
        machine_id = "".join(rng.choices(string.ascii_lowercase + string.digits, k=12))
        if datacenter:
            location = rng.choice(sorted(RUNPOD_DATACENTERS))
            country = RUNPOD_DATACENTERS[location]
        else:
            country = location = rng.choice(RUNPOD_COMMUNITY_COUNTRIES)
        price = card.secure_price if datacenter else card.community_price
        direct = 0 if not datacenter and rng.random() < 0.25 else 100  # 0: no public IP
    else:
        machine_id = str(10_000 + index * 7 + rng.randrange(7))
        location = rng.choice(VAST_PLACES)
        country = location[-2:]
        price = round(card.vast_price * rng.uniform(0.8, 1.25), 3)
        direct = rng.choice((0, 20, 100, 500)) if not datacenter else 500
    cores = count * rng.choice((8, 12, 16))
    return Machine(
        provider=provider,
        index=index,
        machine_id=machine_id,
        host_id=100_000 + rng.randrange(900_000),
        card=card,
        gpus=_gpus(rng, card, count),
        price=price,
        driver=driver,
        actual_driver=driver,
        reliability=round(rng.uniform(0.9, 0.999), 4),
        direct_port_count=direct,
        country=country,
        datacenter=datacenter,
        location=location,
        public_ip=public_ip(index + 1),
        cpu_cores=cores,
        ram_gb=count * rng.choice((32, 64, 128)),
        disk_gb=rng.choice((500, 1000, 2000, 4000)),
        inet_down=float(rng.choice((500, 1000, 2500, 8000))),
        inet_up=float(rng.choice((300, 800, 2000, 8000))),
        owners=[None] * count,
    )
