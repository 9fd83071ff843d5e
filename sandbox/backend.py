"""The seam between the fake provider APIs and the boxes behind them.

The fake APIs decide *what* exists (instances, their state machines, billing); a backend makes
a running instance *real* (an SSH host with the provider's container environment and a GPU the
stand-in NVML reports). `NullBackend` allocates endpoints that nothing answers, which is enough
for API-level tests; `sandbox.boxes` provides the namespaced SSH hosts.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class GpuDevice:
    uuid: str  # "GPU-8c4f...": NVML's nvmlDeviceGetUUID (AMD: amdsmi_get_gpu_device_uuid)
    name: str  # "NVIDIA H100 80GB HBM3" (AMD: the market name, "AMD Instinct MI300X")
    pci_bus_id: str  # "00000000:1B:00.0"
    memory_total: int  # bytes
    serial: str | None = None  # only datacenter cards have one


@dataclass
class GpuSpec:
    # exactly what the vendor's library answers: nvmlSystemGetDriverVersion ("580.95.05"), or
    # on AMD the amdgpu driver's version from amdsmi_get_gpu_driver_info ("6.12.12")
    driver_version: str
    cuda_driver_version: int  # NVML's integer form: 12080 for 12.8; 0 on AMD
    devices: list[GpuDevice] = field(default_factory=list)
    vendor: str = "nvidia"  # "nvidia" (the stand-in NVML) | "amd" (the stand-in AMD SMI)
    rocm_version: str = ""  # AMD only: the ROCm userspace release, "6.4.1"


@dataclass
class BoxSpec:
    box_id: str  # unique across providers: "runpod-<pod id>" or "vast-<instance id>"
    provider: str  # "runpod" | "vast"
    hostname: str  # what `hostname` prints inside the box
    env: dict[str, str]  # the provider's container environment, port variables excluded
    tcp_ports: list[int]  # internal TCP ports the instance asked for; 22 always first
    public_ip: str  # the machine's public address (10.77.1.<n> in the sandbox world)
    authorized_keys: str  # the account's SSH public keys
    gpu: GpuSpec
    start_hook: str | None = None  # shell run at container start (Vast onstart, RunPod start)
    disk_gb: float = 20.0  # the container's disk (RunPod containerDiskInGb; Vast disk)
    # whether the disk outlives a stop and a restart: Vast's does, RunPod's container disk not
    disk_kept: bool = True
    volume_gb: float = 0.0  # RunPod's pod volume (kept until the pod is deleted); 0: none
    volume_path: str | None = None  # where the volume is mounted (volumeMountPath)
    sshd_hung: bool = False  # sshd_hang: each new SSH session logs in and never runs its command
    ssh_cut: bool = False  # ssh_path_cut: the public SSH port drops every connection


@dataclass
class BoxEndpoints:
    ssh_host: str
    ssh_port: int
    public_ip: str
    ports: dict[int, int]  # internal TCP port -> public port (22 included)
    host_key: str | None = None  # "ssh-ed25519 AAAA..." once a real sshd holds it


class BoxBackend(Protocol):
    def start(self, spec: BoxSpec) -> BoxEndpoints: ...  # a known box id resumes on its disks

    def destroy(self, box_id: str) -> None: ...  # kill everything, remove the disk

    def kill(self, box_id: str) -> None: ...  # host death: abrupt, no cleanup hooks

    # container restart: processes die, the disk stays where the provider keeps it; the
    # endpoints now (a new container disk serves a new host key), None if it cannot say
    def restart(self, box_id: str) -> BoxEndpoints | None: ...

    def set_gpu(self, box_id: str, gpu: GpuSpec) -> None: ...  # driver drift under a live box

    def set_sshd_hung(self, box_id: str, hung: bool) -> None: ...  # sshd_hang / sshd_heal

    def set_ssh_cut(self, box_id: str, cut: bool) -> None: ...  # ssh_path_cut / _restore

    def close(self) -> None: ...  # destroy every box this backend started


class NullBackend:
    """Endpoints with nothing behind them: public ports handed out, no host started."""

    def __init__(self, first_port: int = 20000) -> None:
        self._ports = itertools.count(first_port)
        self._lock = threading.Lock()

    def start(self, spec: BoxSpec) -> BoxEndpoints:
        with self._lock:
            ports = {p: next(self._ports) for p in spec.tcp_ports}
        return BoxEndpoints(spec.public_ip, ports[22], spec.public_ip, ports)

    def destroy(self, box_id: str) -> None:
        pass

    def kill(self, box_id: str) -> None:
        pass

    def restart(self, box_id: str) -> None:
        pass

    def set_gpu(self, box_id: str, gpu: GpuSpec) -> None:
        pass

    def set_sshd_hung(self, box_id: str, hung: bool) -> None:
        pass

    def set_ssh_cut(self, box_id: str, cut: bool) -> None:
        pass

    def close(self) -> None:
        pass
