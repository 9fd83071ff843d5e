"""GPU facts through the vendor's library and the admission rule built on them.

NVIDIA's facts come through NVML (nvidia-ml-py, here); AMD's through AMD SMI (amdgpu.py).
Admission: the driver must equal the admitted string exactly (on AMD the amdgpu driver, and the
ROCm release as well), and where qualified GPU UUIDs are configured every GPU of the box must
be one of them. The library missing or failing refuses with its reason; it never raises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agent.base.gpu_facts import GpuFacts

VENDORS = ("nvidia", "amd")
READER = {"nvidia": "NVML", "amd": "AMD SMI"}  # what each vendor's GPUs are read through


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
    pending: bool = False  # no answer from the library yet (GPU programs wait; running stay)
    vendor: str = "nvidia"
    rocm: str | None = None  # AMD only
    wanted_rocm: str | None = None  # AMD only

    @property
    def reader(self) -> str:
        return READER[self.vendor]

    def as_dict(self) -> dict[str, Any]:  # by hand: dataclasses.asdict deep-copies, slowly
        out = {"admitted": self.admitted, "reason": self.reason, "vendor": self.vendor,
               "driver": self.driver, "wanted_driver": self.wanted_driver,
               "uuids": list(self.uuids), "qualified_gpus": list(self.qualified_gpus),
               "checked_at": self.checked_at}
        if self.vendor == "amd":
            out.update(rocm=self.rocm, wanted_rocm=self.wanted_rocm)
        return out


def not_yet(wanted_driver: str, qualified: tuple[str, ...] | list[str], vendor: str = "nvidia",
            wanted_rocm: str = "") -> Admission:
    """The verdict before the library has answered: not admitted, and pending."""
    return Admission(False, f"waiting for {READER[vendor]} to answer", None,
                     wanted_driver or None, [], list(qualified), time.time(), time.monotonic(),
                     pending=True, vendor=vendor, wanted_rocm=wanted_rocm or None)


def read_facts(vendor: str) -> GpuFacts:
    """The GPU facts through the vendor's own library."""
    if vendor == "amd":
        from agent.base.amdgpu import read_amd_gpu

        return read_amd_gpu()
    return read_gpu()


def check(vendor: str, wanted_driver: str, wanted_rocm: str,
          qualified: tuple[str, ...] | list[str]) -> Admission:
    """Read the vendor's GPUs now and judge them (never raises)."""
    return admit(read_facts(vendor), wanted_driver, qualified, wanted_rocm)


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


def admit(facts: GpuFacts, wanted_driver: str, qualified: tuple[str, ...] | list[str],
          wanted_rocm: str = "") -> Admission:
    """The verdict on facts. On AMD both parts of the exact-driver rule hold: the amdgpu
    driver and the ROCm release (each checked where the config names it)."""
    uuids = [d["uuid"] for d in facts.devices]
    amd = facts.vendor == "amd"

    def verdict(ok: bool, reason: str) -> Admission:
        return Admission(ok, reason, facts.driver, wanted_driver or None, uuids, list(qualified),
                         time.time(), time.monotonic(), vendor=facts.vendor, rocm=facts.rocm,
                         wanted_rocm=(wanted_rocm or None) if amd else None)

    if facts.error:
        return verdict(False, facts.error)
    driver = "amdgpu driver" if amd else "driver"
    if wanted_driver and facts.driver != wanted_driver:
        return verdict(False, f"{driver} {facts.driver} is not the admitted {wanted_driver}")
    if amd and wanted_rocm and facts.rocm != wanted_rocm:
        return verdict(False, f"ROCm {facts.rocm} is not the admitted {wanted_rocm}")
    if not uuids:
        return verdict(False, f"{READER[facts.vendor]} sees no GPU")
    if qualified:
        strangers = [u for u in uuids if u not in qualified]
        if strangers:
            return verdict(False, f"GPU {strangers[0]} is not among the qualified GPUs")
    pinned = f"{driver} {facts.driver}" + ("" if wanted_driver else " (not pinned)")
    if amd:
        pinned += f", ROCm {facts.rocm}" + ("" if wanted_rocm else " (not pinned)")
    gpus = f"{len(uuids)} GPU(s)" + (" qualified" if qualified else "")
    return verdict(True, f"{pinned}, {gpus}")
