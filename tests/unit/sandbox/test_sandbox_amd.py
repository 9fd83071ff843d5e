"""The world's AMD machines: appended after the NVIDIA ones (which each seed keeps), on the
amdgpu drivers and ROCm releases of the market, and shown by the fake APIs in the real APIs'
fields: Vast's `gpu_arch`, its amdgpu `driver_version` and ROCm line; RunPod's AMD gpu types,
which take no CUDA filter."""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any

import httpx
from test_sandbox_runpod_api import DEPLOY, deploy
from test_sandbox_vast_api import offers

from sandbox.catalog import AMDGPU_ROCM, make_machine
from sandbox.daemon import Sandbox
from sandbox.world import World

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_the_nvidia_machines_of_a_seed_stay_what_they_were() -> None:
    world = World(seed=5)
    try:
        rng = random.Random("5/machines")
        before = [make_machine(rng, p, i + n * 16)
                  for n, p in enumerate(("runpod", "vast")) for i in range(16)]
        nvidia = [m for p in ("runpod", "vast") for m in world.machines[p]
                  if m.vendor == "nvidia"]
        assert [(m.machine_id, m.card.display, m.driver, m.public_ip, [g.uuid for g in m.gpus])
                for m in nvidia] == [
            (m.machine_id, m.card.display, m.driver, m.public_ip, [g.uuid for g in m.gpus])
            for m in before]
    finally:
        world.close()


def test_the_world_holds_amd_machines_on_amd_drivers(world: World) -> None:
    amd = {p: [m for m in world.machines[p] if m.vendor == "amd"] for p in ("vast", "runpod")}
    assert {m.card.display for m in amd["vast"]} == {"RX 7900 XTX", "MI300X"}
    assert {m.card.display for m in amd["runpod"]} == {"MI300X"}
    everyone = amd["vast"] + amd["runpod"]
    drivers = Counter(m.driver for m in everyone)
    assert drivers.most_common(1)[0][0] == "6.12.12"
    for card in ("RX 7900 XTX", "MI300X"):  # each card is offered on the majority driver
        assert any(m.driver == "6.12.12" for m in amd["vast"] if m.card.display == card)
    ips = [m.public_ip for p in ("runpod", "vast") for m in world.machines[p]]
    assert len(set(ips)) == len(ips)
    for m in everyone:
        assert m.driver in AMDGPU_ROCM and m.rocm == AMDGPU_ROCM[m.driver] and m.cuda == ""
        for g in m.gpus:
            assert UUID.fullmatch(g.uuid) and not g.uuid.startswith("GPU-")
            assert g.name.startswith("AMD ")


def test_an_amd_box_gets_the_amd_gpu_spec_and_drifts_on_its_rocm_release(
        world: World) -> None:
    machine = next(m for m in world.machines["vast"] if m.card.display == "MI300X")
    inst = world.create("vast", machine, 1, image="img", label="amd", env={},
                        tcp_ports=[22], disk_gb=20.0, gpu_rate=machine.price)
    world.advance(world.boot_delay + 0.1)
    assert world.settle()
    spec = world.box_spec(inst).gpu
    assert (spec.vendor, spec.driver_version, spec.rocm_version, spec.cuda_driver_version) == (
        "amd", "6.12.12", "6.4.1", 0)
    world.drift(machine)
    spec = world.box_spec(inst).gpu
    assert (spec.driver_version, spec.rocm_version) == ("6.12.10", "6.4.1")


def test_vast_lists_amd_offers_in_its_fields_and_its_query_filters_them(
        vast: httpx.Client, sbx: Sandbox) -> None:
    rows = offers(vast, gpu_arch={"eq": "amd"})
    assert rows and {r["gpu_name"] for r in rows} == {"RX 7900 XTX", "MI300X"}
    for r in rows:
        assert r["cuda_max_good"] is None and r["rocm_version"] in (6.4, 6.3, 6.2)
        assert r["driver_version"] in AMDGPU_ROCM
    exact = offers(vast, gpu_arch={"eq": "amd"}, driver_version={"eq": 6012012},
                   rocm_version={"in": [6.4]}, gpu_name={"eq": "RX 7900 XTX"})
    assert exact and {(r["driver_version"], r["rocm_version"]) for r in exact} == {
        ("6.12.12", 6.4)}
    nvidia = offers(vast, gpu_arch={"eq": "nvidia"})
    assert nvidia and all(r["cuda_max_good"] and r["rocm_version"] is None for r in nvidia)


def test_runpod_lists_the_mi300x_and_places_it_only_without_a_cuda_filter(
        runpod: Any, sbx: Sandbox) -> None:
    types = runpod.data("query { gpuTypes { id displayName manufacturer } }")["gpuTypes"]
    assert {"id": "AMD Instinct MI300X OAM", "displayName": "MI300X",
            "manufacturer": "AMD"} in types
    pod = deploy(runpod, gpuTypeId="AMD Instinct MI300X OAM")
    assert pod["machine"]["gpuDisplayName"] == "MI300X"
    assert pod["machine"]["machineSystem"]["cudaVersion"] is None
    refused = runpod.post(DEPLOY, {"input": {"imageName": "i", "allowedCudaVersions": ["13.0"],
                                             "gpuTypeId": "AMD Instinct MI300X OAM"}})
    assert refused.json()["data"] == {"podFindAndDeployOnDemand": None}
