"""What a vendor's library says of a box's GPUs: NVML (`gpu`) and AMD SMI (`amdgpu`) readers
both answer in this form, and the admission rule (`gpu.admit`) judges it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuFacts:
    driver: str | None = None  # NVIDIA's driver; on AMD the amdgpu driver
    cuda_driver_version: int | None = None  # NVML's integer form, 12080 for 12.8
    devices: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    vendor: str = "nvidia"
    rocm: str | None = None  # AMD only: the ROCm release, "6.4.1"

    @property
    def cuda(self) -> str | None:
        v = self.cuda_driver_version
        return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "driver": self.driver,
            "cuda": self.cuda,
            "cuda_driver_version": self.cuda_driver_version,
            "rocm": self.rocm,
            "devices": self.devices,
            "error": self.error,
        }
