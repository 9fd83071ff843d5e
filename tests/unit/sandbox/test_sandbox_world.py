"""The seeded world: machines, the instance state machine, the backend calls, billing."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

import pytest

from sandbox.catalog import DRIVER_CUDA, driver_number, public_ip
from sandbox.world import RUNPOD_GB_MONTH, Instance, World, WorldError, vast_storage_rate

Boot = Callable[[World], None]


def rent(world: World, provider: str = "vast", **kw: object) -> Instance:
    machine = next(m for m in world.machines[provider] if m.free_gpus >= 1)
    args: dict = dict(image="img", label="t", env={"K": "v"}, tcp_ports=[22, 26611],
                      disk_gb=20.0, gpu_rate=machine.price,
                      storage_rate=vast_storage_rate(20.0) if provider == "vast" else 0.0)
    args.update(kw)
    return world.create(provider, machine, 1, **args)


def test_same_seed_same_world_and_another_seed_differs() -> None:
    def fingerprint(w: World) -> list[tuple]:
        return [(m.machine_id, m.card.display, m.gpu_count, m.driver, m.price,
                 [g.uuid for g in m.gpus]) for p in ("runpod", "vast") for m in w.machines[p]]

    a, b, c = World(seed=1), World(seed=1), World(seed=2)
    try:
        assert fingerprint(a) == fingerprint(b)
        assert fingerprint(a) != fingerprint(c)
    finally:
        for w in (a, b, c):
            w.close()


def test_machines_carry_what_the_apis_and_nvml_need(world: World) -> None:
    # the NVIDIA machines (the AMD ones follow them: test_sandbox_amd.py)
    machines = [m for p in ("runpod", "vast") for m in world.machines[p] if m.vendor == "nvidia"]
    assert len(machines) == 32
    assert [m.public_ip for m in machines] == [f"10.77.1.{n}" for n in range(1, 33)]
    drivers = Counter(m.driver for m in machines)
    assert drivers.most_common(1)[0][0] == "580.95.05"
    assert len(drivers) >= 3
    assert {m.cuda for m in machines} <= set(DRIVER_CUDA.values())
    assert any(m.datacenter for m in machines) and any(not m.datacenter for m in machines)
    for m in machines:
        assert 0.9 <= m.reliability < 1
        assert len(m.country) == 2
        assert len({g.uuid for g in m.gpus}) == m.gpu_count
        for g in m.gpus:
            assert re.fullmatch(r"GPU-[0-9a-f-]{36}", g.uuid)
            assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", g.pci_bus_id)
            assert g.memory_total == m.card.memory_gb * 1024**3
            assert (g.serial is not None) == m.card.datacenter_card


def test_driver_encoding_and_addresses_past_the_first_block() -> None:
    assert driver_number("535.86.05") == 535086005
    assert driver_number("580.95.05") == 580095005
    assert public_ip(254) == "10.77.1.254"
    assert public_ip(255) == "10.77.2.1"


def test_a_thousand_box_world(booted: Boot) -> None:
    big = World(seed=3, machines_per_provider=500, boot_delay=0.0)
    try:
        made = big.create_many("runpod", 500) + big.create_many("vast", 500)
        booted(big)
        nvidia = [m for p in ("runpod", "vast") for m in big.machines[p] if m.vendor == "nvidia"]
        assert len({m.public_ip for m in nvidia}) == 1000
        assert Counter(i.phase for i in made) == {"running": 1000}
        assert len({i.label for i in made if i.provider == "vast"}) == 500
    finally:
        big.close()


def test_create_boots_after_the_delay_and_only_once_the_backend_returned(
    world: World, backend, booted: Boot
) -> None:
    inst = rent(world)
    assert inst.phase == "provisioning" and inst.endpoints is None
    backend.hold.clear()  # the backend is slow: start blocks
    world.advance(1.0)
    assert inst.phase == "provisioning" and inst.backend_live
    backend.hold.set()
    assert world.settle(30)
    assert inst.phase == "running"
    assert inst.endpoints is not None and inst.endpoints.public_ip == inst.machine.public_ip
    assert backend.ops(inst.key) == ["start"]


def test_box_spec_has_the_provider_container_environment(world: World, backend,
                                                         booted: Boot) -> None:
    world.ssh_keys["vast"].append("ssh-ed25519 AAAA vast-key")
    world.ssh_keys["runpod"].append("ssh-ed25519 AAAA runpod-key")
    v = rent(world, "vast", start_hook="echo hi")
    r = rent(world, "runpod")
    booted(world)
    vs, rs = backend.specs[v.key], backend.specs[r.key]
    assert vs.env["VAST_CONTAINERLABEL"] == f"C.{v.id}" and vs.env["CONTAINER_ID"] == v.id
    assert vs.env["PUBLIC_IPADDR"] == v.machine.public_ip and vs.env["K"] == "v"
    assert vs.authorized_keys == "ssh-ed25519 AAAA vast-key" and vs.start_hook == "echo hi"
    assert vs.tcp_ports == [22, 26611]
    assert rs.env["RUNPOD_POD_ID"] == r.id and rs.env["RUNPOD_GPU_COUNT"] == "1"
    assert rs.env["RUNPOD_PUBLIC_IP"] == r.machine.public_ip
    assert rs.env["PUBLIC_KEY"] == rs.authorized_keys == "ssh-ed25519 AAAA runpod-key"
    assert rs.gpu.driver_version == r.machine.driver
    assert rs.gpu.devices == [r.machine.gpus[0]]
    assert rs.gpu.cuda_driver_version == int(float(r.machine.cuda) * 1000)


def test_stop_resume_destroy(world: World, backend, booted: Boot) -> None:
    inst = rent(world)
    booted(world)
    world.stop(inst)
    assert inst.phase == "stopped" and inst.endpoints is None and inst.gpu_indices == []
    world.resume(inst)
    booted(world)
    assert inst.phase == "running"
    world.destroy(inst)
    assert world.settle(30)
    assert backend.ops(inst.key) == ["start", "kill", "start", "destroy"]
    assert world.get("vast", inst.id) is None
    with pytest.raises(WorldError):
        world.destroy(inst)


def test_resume_when_the_gpus_were_taken(world: World, booted: Boot) -> None:
    inst = rent(world, "runpod")
    booted(world)
    world.stop(inst)
    world.take_capacity(inst.machine, inst.machine.free_gpus)
    with pytest.raises(WorldError, match="not enough free GPUs on the host machine"):
        world.resume(inst)
    vast = rent(world, "vast")
    world.stop(vast)
    world.take_capacity(vast.machine, vast.machine.free_gpus)
    world.resume(vast, wait_for_gpus=True)
    assert vast.phase == "scheduling"
    vast.machine.owners[:] = [None] * vast.machine.gpu_count  # the other tenant leaves
    world.tick()
    assert vast.phase == "provisioning"
    booted(world)
    assert vast.phase == "running"


def test_destroy_while_booting_never_runs(world: World, backend) -> None:
    inst = rent(world)
    backend.hold.clear()
    world.advance(1.0)
    world.destroy(inst)
    backend.hold.set()
    assert world.settle(30)
    assert inst.phase == "destroyed" and inst.endpoints is None
    assert backend.ops(inst.key) == ["start", "destroy"]


def test_host_death_restart_drift_reach_the_backend(world: World, backend,
                                                    booted: Boot) -> None:
    inst = rent(world)
    booted(world)
    advertised = inst.machine.driver
    new = world.drift(inst.machine)
    world.restart_container(inst)
    world.host_death(inst.machine)
    assert world.settle(30)
    assert backend.ops(inst.key) == ["start", "set_gpu", "restart", "kill"]
    assert backend.gpus[inst.key].driver_version == new != advertised
    assert inst.machine.driver == advertised  # the API keeps advertising the old one
    assert inst.machine.free_gpus == 0
    assert not world.host_noticed(inst)
    world.advance(5.0)
    assert world.host_noticed(inst)


def test_billing_runpod(world: World, booted: Boot) -> None:
    inst = rent(world, "runpod", disk_gb=20.0, volume_gb=50.0)
    per_gb_hour = RUNPOD_GB_MONTH / 720
    booted(world)  # one second provisioning: storage only
    world.advance(3600)
    world.stop(inst)
    world.advance(3600)
    meter = world.ledger.meter(inst.key, world.now())
    assert meter is not None
    assert meter["gpu_usd"] == pytest.approx(inst.gpu_rate)
    running_storage = 70 * per_gb_hour * (3600 + 1) / 3600
    stopped_storage = 50 * 2 * per_gb_hour  # the volume, at twice the rate
    assert meter["storage_usd"] == pytest.approx(running_storage + stopped_storage)
    world.destroy(inst)
    before = world.ledger.meter(inst.key, world.now())
    world.advance(10 * 3600)
    after = world.ledger.meter(inst.key, world.now())
    assert before == after and after is not None
    assert after["gpu_usd_per_hour"] == after["storage_usd_per_hour"] == 0


def test_billing_vast_storage_from_creation(world: World, backend) -> None:
    inst = rent(world, "vast", disk_gb=40.0, storage_rate=vast_storage_rate(40.0))
    # The boot falls due during this jump and its start goes to a worker thread; held there,
    # it finishes only after the clock moved on below, not at a moment the threads choose.
    backend.hold.clear()
    world.advance(1800)  # provisioning (the boot is due, its start held): storage only
    world.advance(world.boot_delay)
    backend.hold.set()
    assert world.settle(30)  # running from creation + 1801 s
    world.advance(3600)
    world.stop(inst)
    world.advance(3600)
    meter = world.ledger.meter(inst.key, world.now())
    assert meter is not None
    assert meter["gpu_usd"] == pytest.approx(inst.gpu_rate)
    assert meter["storage_usd"] == pytest.approx(vast_storage_rate(40.0) * (1800 + 1 + 7200)
                                                 / 3600)
    world.destroy(inst)
    snap = world.ledger.snapshot(world.now())
    assert snap["usd_per_hour"] == 0
    phases = [e["phase"] for e in snap["events"] if e["id"] == inst.id]
    assert phases == ["provisioning", "running", "stopped", "destroyed"]


def test_host_death_stops_gpu_charges_but_not_storage(world: World, booted: Boot) -> None:
    inst = rent(world, "vast")
    booted(world)
    world.host_death(inst.machine)
    meter = world.ledger.meter(inst.key, world.now())
    assert meter is not None
    assert meter["gpu_usd_per_hour"] == 0 and meter["storage_usd_per_hour"] > 0


def test_a_host_that_dies_before_boot_never_boots(world: World, backend, booted: Boot) -> None:
    inst = rent(world, "runpod")
    world.host_death(inst.machine)
    booted(world)
    assert inst.phase == "provisioning" and backend.ops(inst.key) == []
