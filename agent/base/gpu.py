"""GPU facts through NVML (nvidia-ml-py) and the admission rule built on them.

Admission: the driver must equal the admitted string exactly, and where qualified GPU UUIDs
are configured every GPU of the box must be one of them. NVML missing or failing refuses with
its reason; it never raises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuFacts:
    driver: str | None = None
    cuda_driver_version: int | None = None  # NVML's integer form, 12080 for 12.8
    devices: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def cuda(self) -> str | None:
        v = self.cuda_driver_version
        return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "cuda": self.cuda,
            "cuda_driver_version": self.cuda_driver_version,
            "devices": self.devices,
            "error": self.error,
        }


@dataclass(frozen=True)
class Admission:
    admitted: bool
    reason: str
    driver: str | None
    wanted_driver: str | None
    uuids: list[str]
    qualified_gpus: list[str]
    checked_at: float  # wall time, for display
    checked_mono: float = 0.0  # monotonic time: what its freshness is judged by
    pending: bool = False  # no answer from NVML yet (GPU programs wait; running ones stay)

    def as_dict(self) -> dict[str, Any]:  # by hand: dataclasses.asdict deep-copies, slowly
        return {"admitted": self.admitted, "reason": self.reason, "driver": self.driver,
                "wanted_driver": self.wanted_driver, "uuids": list(self.uuids),
                "qualified_gpus": list(self.qualified_gpus), "checked_at": self.checked_at}


def not_yet(wanted_driver: str, qualified: tuple[str, ...] | list[str]) -> Admission:
    """The verdict before NVML has answered: not admitted, and pending."""
    return Admission(False, "waiting for NVML to answer", None, wanted_driver or None, [],
                     list(qualified), time.time(), time.monotonic(), pending=True)


def read_gpu() -> GpuFacts:
    try:
        import pynvml
    except ImportError:
        return GpuFacts(error="nvidia-ml-py (pynvml) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return GpuFacts(error="NVML library libnvidia-ml.so.1 not found (no NVIDIA driver here)")
    except pynvml.NVMLError as e:
        return GpuFacts(error=f"NVML init failed: {e}")
    except Exception as e:  # a broken library may fail in ways pynvml does not wrap
        return GpuFacts(error=f"NVML init failed: {type(e).__name__}: {e}")
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        devices = [_device(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
        return GpuFacts(driver=driver, cuda_driver_version=cuda, devices=devices)
    except pynvml.NVMLError as e:
        return GpuFacts(error=f"NVML query failed: {e}")
    except Exception as e:
        return GpuFacts(error=f"NVML query failed: {type(e).__name__}: {e}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _device(pynvml: Any, index: int) -> dict[str, Any]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def optional(fn: Any) -> Any:
        try:
            return fn(handle)
        except pynvml.NVMLError:
            return None

    memory = optional(pynvml.nvmlDeviceGetMemoryInfo)
    pci = optional(pynvml.nvmlDeviceGetPciInfo)
    return {
        "index": index,
        "uuid": pynvml.nvmlDeviceGetUUID(handle),
        "name": optional(pynvml.nvmlDeviceGetName),
        "serial": optional(pynvml.nvmlDeviceGetSerial),  # only cards with an inforom have one
        "pci_bus_id": None if pci is None else _text(pci.busId),
        "memory_total": None if memory is None else int(memory.total),
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def admit(facts: GpuFacts, wanted_driver: str, qualified: tuple[str, ...] | list[str]) -> Admission:
    uuids = [d["uuid"] for d in facts.devices]

    def verdict(ok: bool, reason: str) -> Admission:
        return Admission(ok, reason, facts.driver, wanted_driver or None, uuids, list(qualified),
                         time.time(), time.monotonic())

    if facts.error:
        return verdict(False, facts.error)
    if wanted_driver and facts.driver != wanted_driver:
        return verdict(False, f"driver {facts.driver} is not the admitted {wanted_driver}")
    if not uuids:
        return verdict(False, "NVML sees no GPU")
    if qualified:
        strangers = [u for u in uuids if u not in qualified]
        if strangers:
            return verdict(False, f"GPU {strangers[0]} is not among the qualified GPUs")
    pinned = f"driver {facts.driver}" if wanted_driver else f"driver {facts.driver} (not pinned)"
    gpus = f"{len(uuids)} GPU(s)" + (" qualified" if qualified else "")
    return verdict(True, f"{pinned}, {gpus}")
