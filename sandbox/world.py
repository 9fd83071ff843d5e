"""The sandbox's seeded world: machines, instances with their state machines, billing, faults.

One `World` serves both fake providers. It decides what exists; the API modules render it in
each provider's wire format, and a `BoxBackend` makes running instances real.

Instance phases (provider-neutral; the APIs map them to their own status fields):

    provisioning --(boot delay, then backend.start returned)--> running
    running --stop--> stopped --resume--> provisioning (Vast: scheduling while GPUs are taken)
    running --preempt--> exited (RunPod spot) / stopped (Vast outbid)
    any --destroy--> destroyed

Host death leaves the phase alone and marks the machine dead; the APIs notice it only
`notice_delay` seconds later (RunPod: runtime null, desiredStatus RUNNING; Vast: unknown, then
offline). GPU charges stop at death; storage keeps accruing until destroy.
"""

from __future__ import annotations

import heapq
import random
import secrets
import string
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sandbox.backend import BoxBackend, BoxEndpoints, BoxSpec, GpuSpec, NullBackend
from sandbox.boxops import BoxOps
from sandbox.catalog import (
    AMD_DRIFT_SIBLING,
    DRIFT_SIBLING,
    Machine,
    cuda_for,
    cuda_int,
    known_driver,
    make_amd_machines,
    make_machine,
    rocm_for,
)
from sandbox.faults import INSTANCE_KINDS, KINDS, PROVIDER_KINDS, FaultBook, FaultError
from sandbox.ledger import Ledger

PROVIDERS = ("runpod", "vast")
RUNPOD_GB_MONTH = 0.10  # container disk and volume, running; the volume costs twice this stopped
HOURS_PER_MONTH = 720.0
OTHER_TENANT = "other-tenant"  # GPU owner for capacity taken by somebody else (offer_gone)
LIVE_PHASES = ("provisioning", "running", "scheduling")


class WorldError(Exception):
    """A refusal the provider would answer with; the API module picks the wire shape."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Instance:
    provider: str
    id: str  # RunPod pod id; Vast instance id as text
    machine: Machine
    gpu_count: int
    image: str
    label: str  # RunPod pod name; Vast label
    env: dict[str, str]
    tcp_ports: list[int]  # internal TCP ports asked for (Vast: -p mappings; RunPod: N/tcp)
    disk_gb: float  # RunPod containerDiskInGb; Vast disk
    created_at: float
    gpu_rate: float  # USD/h for the GPUs: on-demand price or the spot bid
    storage_rate: float  # Vast: storage_total_cost (USD/h), billed from creation
    volume_gb: float = 0.0  # RunPod pod volume
    start_hook: str | None = None
    spot: bool = False
    bid: float | None = None  # RunPod bidPerGpu; Vast price
    http_ports: list[int] = field(default_factory=list)  # RunPod only
    extra: dict[str, Any] = field(default_factory=dict)  # request fields echoed back
    phase: str = "provisioning"
    intended: str = "running"  # Vast intended_status
    reason: str = "Rented by User"  # RunPod lastStatusChange text
    status_msg: str = ""  # Vast status_msg
    changed_at: float = 0.0
    started_at: float | None = None  # when the current run began
    endpoints: BoxEndpoints | None = None
    gpu: GpuSpec | None = None
    gpu_indices: list[int] = field(default_factory=list)
    generation: int = 0  # bumps per boot, so a stale backend.start result is ignored
    backend_live: bool = False  # a start was submitted and not yet undone
    api_key: str = ""  # Vast instance_api_key
    restarts: int = 0
    sshd_hung: bool = False  # sshd_hang: its SSH logins hang until sshd_heal
    account: int = 1  # the provider account (API key) that owns it

    @property
    def key(self) -> str:
        """The box id across providers: "runpod-<pod id>" or "vast-<instance id>"."""
        return f"{self.provider}-{self.id}"


class World:
    """Everything both fake providers know, behind one lock, driven by one clock."""

    def __init__(
        self,
        seed: int = 0,
        machines_per_provider: int = 16,
        backend: BoxBackend | None = None,
        boot_delay: float = 1.0,
        notice_delay: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.seed = seed
        self.backend: BoxBackend = backend or NullBackend()
        self.boot_delay = boot_delay
        self.notice_delay = notice_delay
        # RunPod's bill lags its meters (it bills every 5 minutes); tests may set it small
        self.billing_delay = 300.0
        self.lock = threading.RLock()
        self.faults = FaultBook()
        self.ledger = Ledger()
        self.ssh_keys: dict[str, list[str]] = {p: [] for p in PROVIDERS}
        self.ssh_cut: set[str] = set()  # providers whose SSH path is cut (ssh_path_cut)
        # each provider's API keys, each an account (1, 2, ...) owning the boxes made with it
        self.accounts: dict[str, dict[str, int]] = {p: {} for p in PROVIDERS}
        self.instances: dict[str, Instance] = {}
        self._clock = clock
        self._offset = 0.0
        self._rng = random.Random(f"{seed}/runtime")
        self._vast_next_id = 20_000_000 + self._rng.randrange(1_000_000)
        self._boots: list[tuple[float, int, str, int]] = []  # (due, seq, key, generation)
        self._seq = 0
        self._ops = BoxOps()
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        machine_rng = random.Random(f"{seed}/machines")
        self.machines: dict[str, list[Machine]] = {p: [] for p in PROVIDERS}
        for p_index, provider in enumerate(PROVIDERS):
            for i in range(machines_per_provider):
                index = p_index * machines_per_provider + i
                self.machines[provider].append(make_machine(machine_rng, provider, index))
        # AMD machines after all of them, from their own stream: the NVIDIA ones (their
        # order, ids and addresses) stay what each seed made them before
        amd_rng = random.Random(f"{seed}/amd-machines")
        first = len(PROVIDERS) * machines_per_provider
        for provider in PROVIDERS:
            made = make_amd_machines(amd_rng, provider, first)
            self.machines[provider].extend(made)
            first += len(made)

    # -- clock -------------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock() + self._offset

    def advance(self, seconds: float) -> float:
        """Jump the clock forward (boot delays, notice delays and billing all follow)."""
        with self.lock:
            self._offset += max(0.0, seconds)
        self.tick()
        return self.now()

    def tick(self) -> None:
        """Start the boots that are due and place Vast instances waiting for GPUs."""
        with self.lock:
            now = self.now()
            while self._boots and self._boots[0][0] <= now:
                _, _, key, generation = heapq.heappop(self._boots)
                inst = self.instances.get(key)
                # a box whose host died before it booted stays provisioning, as on RunPod
                if (inst and inst.generation == generation and inst.phase == "provisioning"
                        and inst.machine.dead_at is None):
                    self._submit_start(inst)
            for inst in self.instances.values():
                if inst.phase == "scheduling" and self._allocate(inst):
                    self._begin_boot(inst)

    def start_ticker(self, interval: float = 0.05) -> None:
        if self._ticker is None:
            self._ticker = threading.Thread(
                target=self._tick_loop, args=(interval,), name="sandbox-clock", daemon=True
            )
            self._ticker.start()

    def _tick_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.tick()

    def settle(self, timeout: float = 30.0) -> bool:
        """Wait until no backend call is pending (tests, shutdown)."""
        return self._ops.drain(timeout)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self._ops.close()
        self.backend.close()

    # -- accounts ----------------------------------------------------------------------------

    def add_account(self, provider: str, key: str | None = None) -> str:
        """Register `key` (a new one when None) as an account of `provider`; a known key
        keeps its account. The first key is account 1, which owns boxes made off the APIs."""
        if provider not in PROVIDERS:
            raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, not {provider!r}")
        key = key or new_key(provider)
        with self.lock:
            keys = self.accounts[provider]
            keys.setdefault(key, len(keys) + 1)
        return key

    def account(self, provider: str, key: str | None) -> int | None:
        """The account `key` opens at `provider`, or None for an unknown (or no) key."""
        return self.accounts[provider].get(key) if key is not None else None

    # -- lookup ------------------------------------------------------------------------------

    def live(self, provider: str, account: int | None = None) -> list[Instance]:
        """The provider's instances that still exist, oldest first; `account`'s only when
        given."""
        return [
            i for i in self.instances.values() if i.provider == provider
            and i.phase != "destroyed" and account in (None, i.account)
        ]

    def get(self, provider: str, instance_id: str, account: int | None = None) -> Instance | None:
        """A live instance by id; None as well when `account` is given and not its owner (a
        provider answers for another account's box as for none)."""
        inst = self.instances.get(f"{provider}-{instance_id}")
        if inst is None or inst.phase == "destroyed" or account not in (None, inst.account):
            return None
        return inst

    def charges(self, since: float, until: float, now: float, provider: str,
                account: int) -> list[dict[str, Any]]:
        """`Ledger.charges` of `account`'s instances at `provider`: a bill is an account's."""
        return [c for c in self.ledger.charges(since, until, now, provider)
                if self.instances[f"{provider}-{c['id']}"].account == account]

    def find(self, target: str) -> list[Instance]:
        """Live instances named by id, box id ("vast-123") or label."""
        return [
            i for i in self.instances.values()
            if i.phase != "destroyed" and target in (i.id, i.key, i.label)
        ]

    def machine(self, provider: str, machine_id: str) -> Machine | None:
        return next((m for m in self.machines[provider] if m.machine_id == machine_id), None)

    def host_noticed(self, inst: Instance, factor: float = 1.0) -> bool:
        """Whether the provider has noticed the host died (after `factor` notice delays)."""
        dead_at = inst.machine.dead_at
        if inst.machine.silent:
            return True
        return dead_at is not None and self.now() - dead_at >= self.notice_delay * factor

    # -- lifecycle ---------------------------------------------------------------------------

    def pick(self, machines: list[Machine]) -> Machine:
        """One of `machines`, drawn from the world's seeded stream (placement spreads drivers)."""
        return self._rng.choice(machines)

    def new_runpod_id(self) -> str:
        return "".join(self._rng.choices(string.ascii_lowercase + string.digits, k=14))

    def create(
        self,
        provider: str,
        machine: Machine,
        gpu_count: int,
        *,
        image: str,
        label: str,
        env: dict[str, str],
        tcp_ports: Iterable[int],
        disk_gb: float,
        gpu_rate: float,
        storage_rate: float = 0.0,
        stopped: bool = False,
        **fields: Any,
    ) -> Instance:
        """Rent `gpu_count` GPUs of `machine`; `stopped` creates it stopped (Vast low bid)."""
        with self.lock:
            if not stopped and machine.free_gpus < gpu_count:
                raise WorldError("no_capacity", "not enough free GPUs on the machine")
            if provider == "vast":
                instance_id = str(self._vast_next_id)
                self._vast_next_id += 1
            else:
                instance_id = self.new_runpod_id()
            now = self.now()
            inst = Instance(
                provider=provider, id=instance_id, machine=machine, gpu_count=gpu_count,
                image=image, label=label, env=dict(env),
                tcp_ports=[22, *[p for p in dict.fromkeys(tcp_ports) if p != 22]],
                disk_gb=disk_gb, created_at=now, changed_at=now, gpu_rate=gpu_rate,
                storage_rate=storage_rate, api_key=secrets.token_hex(32), **fields,
            )
            self.instances[inst.key] = inst
            drift = self.faults.take_instance("driver_drift", provider, self._create_names(inst))
            if drift is not None:
                self.drift(machine, drift.params.get("driver"))
            if stopped:
                inst.phase, inst.intended = "stopped", "stopped"
                inst.status_msg = "bid below the current minimum; waiting for capacity"
                self._bill(inst)
            else:
                self._allocate(inst)
                self._begin_boot(inst)
            return inst

    def stop(self, inst: Instance, reason: str = "Exited by user") -> None:
        with self.lock:
            if inst.phase == "destroyed":
                raise WorldError("not_found", "instance not found")
            inst.intended = "stopped"
            if inst.phase in ("stopped", "exited"):
                return
            self._halt(inst, "stopped", reason)

    def resume(self, inst: Instance, wait_for_gpus: bool = False) -> None:
        """Start a stopped instance again on its machine. RunPod refuses when the GPUs are
        taken; Vast (`wait_for_gpus`) waits in `scheduling` until they free up."""
        with self.lock:
            if inst.phase == "destroyed":
                raise WorldError("not_found", "instance not found")
            inst.intended = "running"
            if inst.phase in LIVE_PHASES:
                return
            if inst.machine.free_gpus < inst.gpu_count:
                if not wait_for_gpus:
                    raise WorldError(
                        "no_capacity",
                        "There are not enough free GPUs on the host machine to start this pod.",
                    )
                self._set_phase(inst, "scheduling", "Resumed by user")
                return
            self._allocate(inst)
            inst.reason = "Resumed by user"
            self._begin_boot(inst)

    def destroy(self, inst: Instance) -> None:
        with self.lock:
            if inst.phase == "destroyed":
                raise WorldError("not_found", "instance not found")
            self._release(inst)
            self._set_phase(inst, "destroyed", "Terminated by user")
            inst.endpoints = None
            inst.backend_live = False
            self._ops.submit(inst.key, partial(self.backend.destroy, inst.key))

    def restart_container(self, inst: Instance) -> None:
        """The container restarts: processes die, the disk stays, uptime starts over."""
        with self.lock:
            if inst.phase != "running" or inst.machine.dead_at is not None:
                raise WorldError("not_running", "instance is not running")
            inst.restarts += 1
            inst.started_at = self.now()
            self._ops.submit(inst.key, partial(self._restart, inst, inst.generation))

    def _restart(self, inst: Instance, generation: int) -> None:
        endpoints = self.backend.restart(inst.key)
        with self.lock:  # the host key its sshd serves now (a new container disk, a new key)
            if endpoints is not None and inst.generation == generation and inst.endpoints:
                inst.endpoints = endpoints

    def preempt(self, inst: Instance) -> None:
        """Spot reclaim: RunPod pods exit; Vast instances get the outbid 'stopped' triple."""
        with self.lock:
            if inst.phase not in LIVE_PHASES:
                raise WorldError("not_running", "instance is not running")
            if inst.provider == "vast":
                inst.intended = "stopped"
                inst.status_msg = "outbid: a higher bid took the GPUs"
                self._halt(inst, "stopped", "Outbid")
            else:
                self._halt(inst, "exited", "Interrupted: spot instance reclaimed")

    def host_death(self, machine: Machine) -> list[Instance]:
        """The machine dies now: its boxes are killed and its GPUs leave the market."""
        with self.lock:
            if machine.dead_at is not None:
                return []
            machine.dead_at = self.now()
            hit = [i for i in self.instances.values()
                   if i.machine is machine and i.phase != "destroyed"]
            for inst in hit:
                self._bill(inst)
                self._kill(inst)
            return hit

    def drift(self, machine: Machine, driver: str | None = None) -> str:
        """The machine's NVML (or AMD SMI) now reports another driver; the API keeps
        advertising the old."""
        with self.lock:
            amd = machine.vendor == "amd"
            new = driver or (AMD_DRIFT_SIBLING if amd else DRIFT_SIBLING)[machine.actual_driver]
            (rocm_for if amd else cuda_for)(new)  # the vendor's form, or ValueError
            machine.actual_driver = new
            for inst in self.instances.values():
                if inst.machine is machine and inst.gpu is not None:
                    inst.gpu = self._gpu_spec(inst)
                    if inst.backend_live:
                        set_gpu = partial(self.backend.set_gpu, inst.key, inst.gpu)
                        self._ops.submit(inst.key, set_gpu)
            return machine.actual_driver

    def hang_sshd(self, inst: Instance, hung: bool) -> None:
        """sshd_hang (`hung`) or sshd_heal: the box's SSH logins hang from now on, across
        restarts, or work again."""
        with self.lock:
            inst.sshd_hung = hung
            if inst.backend_live:
                self._ops.submit(inst.key, partial(self.backend.set_sshd_hung, inst.key, hung))

    def cut_ssh_path(self, provider: str, cut: bool) -> list[str]:
        """ssh_path_cut (`cut`) or ssh_path_restore: the operator's SSH path to the provider's
        boxes fails, theirs now and those that start later, or works again. The boxes, their
        other ports and the API run on. Returns the box ids it reached now."""
        if provider not in PROVIDERS:
            raise FaultError(f"the SSH path is a provider's: {', '.join(PROVIDERS)}, "
                             f"not {provider!r}")
        with self.lock:
            if cut:
                self.ssh_cut.add(provider)
            else:
                self.ssh_cut.discard(provider)
            live = [i for i in self.live(provider) if i.backend_live]
            for inst in live:
                self._ops.submit(inst.key, partial(self.backend.set_ssh_cut, inst.key, cut))
            return [i.key for i in live]

    def take_capacity(self, machine: Machine, gpus: int) -> None:
        """Another tenant rents `gpus` free GPUs of `machine` (an offer vanishes)."""
        with self.lock:
            for i, owner in enumerate(machine.owners):
                if gpus and owner is None:
                    machine.owners[i] = OTHER_TENANT
                    gpus -= 1

    def set_other_tenants(self, machine: Machine, gpus: int) -> None:
        """Other tenants hold `gpus` of `machine`'s GPUs that the world's boxes leave free (the
        control surface shapes the market with it); ValueError past what is free."""
        with self.lock:
            theirs = [i for i, o in enumerate(machine.owners) if o == OTHER_TENANT]
            free = [i for i, o in enumerate(machine.owners) if o is None]
            if not 0 <= gpus <= len(theirs) + len(free):
                raise ValueError(f"machine {machine.machine_id}: other tenants can hold 0 to "
                                 f"{len(theirs) + len(free)} GPUs, not {gpus}")
            for i in theirs:
                machine.owners[i] = None
            for i in (theirs + free)[:gpus]:
                machine.owners[i] = OTHER_TENANT

    # -- faults ------------------------------------------------------------------------------

    def inject(self, kind: str, target: str, count: int = 1, **params: Any) -> dict[str, Any]:
        """Queue a fault, or apply it at once: an instance fault when `target` names instances,
        a provider fault always."""
        if kind not in KINDS:
            raise FaultError(f"unknown fault kind {kind!r}; known: {', '.join(sorted(KINDS))}")
        if params.get("driver") is not None:
            known_driver(str(params["driver"]))  # refuse a malformed driver now, not at boot
        if kind in PROVIDER_KINDS:
            return {"kind": kind, "target": target,
                    "applied": self.cut_ssh_path(target, kind == "ssh_path_cut")}
        with self.lock:
            if kind in INSTANCE_KINDS:
                named = self.find(target)
                if named:
                    return {"kind": kind, "target": target, "applied": [
                        self._apply(kind, inst, params) for inst in named[:count]
                    ]}
                if kind == "sshd_heal":  # a new box's sshd does not hang: nothing to wait for
                    raise FaultError(f"sshd_heal: no live instance or label named {target!r}")
                if target not in ("*", *PROVIDERS, "create", "runpod.create", "vast.create"):
                    raise FaultError(f"no live instance, label or provider named {target!r}")
            fault = self.faults.add(kind, target, count, **params)
            return {"kind": kind, "target": target, "queued": fault.to_dict()}

    def _apply(self, kind: str, inst: Instance, params: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"id": inst.id, "provider": inst.provider, "box_id": inst.key}
        if kind == "host_death":
            self.host_death(inst.machine)
        elif kind == "driver_drift":
            out["driver"] = self.drift(inst.machine, params.get("driver"))
        elif kind == "container_restart":
            self.restart_container(inst)
        elif kind == "heartbeat_lost":
            inst.machine.silent = True
        elif kind in ("sshd_hang", "sshd_heal"):
            self.hang_sshd(inst, kind == "sshd_hang")
        else:
            self.preempt(inst)
        return out

    @staticmethod
    def _create_names(inst: Instance) -> set[str]:
        return {"create", f"{inst.provider}.create"}

    def _on_running(self, inst: Instance) -> None:
        """Instance faults queued for 'the next box' hit it as soon as it runs."""
        for kind in ("host_death", "container_restart", "preempt", "heartbeat_lost",
                     "sshd_hang"):
            fault = self.faults.take_instance(kind, inst.provider, self._create_names(inst))
            if fault is not None and inst.phase == "running":
                self._apply(kind, inst, fault.params)

    # -- internals ---------------------------------------------------------------------------

    def _allocate(self, inst: Instance) -> bool:
        machine = inst.machine
        free = [i for i, owner in enumerate(machine.owners) if owner is None]
        if machine.dead_at is not None or len(free) < inst.gpu_count:
            return False
        inst.gpu_indices = free[: inst.gpu_count]
        for i in inst.gpu_indices:
            machine.owners[i] = inst.key
        return True

    def _release(self, inst: Instance) -> None:
        for i in inst.gpu_indices:
            if inst.machine.owners[i] == inst.key:
                inst.machine.owners[i] = None
        inst.gpu_indices = []

    def _begin_boot(self, inst: Instance) -> None:
        inst.generation += 1
        self._set_phase(inst, "provisioning", inst.reason)
        self._seq += 1
        due = self.now() + self.boot_delay
        heapq.heappush(self._boots, (due, self._seq, inst.key, inst.generation))

    def _submit_start(self, inst: Instance) -> None:
        inst.gpu = self._gpu_spec(inst)
        spec = self.box_spec(inst)
        generation = inst.generation
        inst.backend_live = True
        self._ops.submit(inst.key, lambda: self._start(inst, generation, spec))

    def _start(self, inst: Instance, generation: int, spec: BoxSpec) -> None:
        try:
            endpoints = self.backend.start(spec)
        except Exception as exc:
            with self.lock:
                if inst.generation == generation and inst.phase == "provisioning":
                    inst.status_msg = f"container start failed: {exc}"
                    self._halt(inst, "exited", "Container failed to start")
            raise
        with self.lock:
            if inst.generation != generation or inst.phase != "provisioning":
                return  # stopped or destroyed meanwhile; the op queued behind us undoes it
            inst.endpoints = endpoints
            inst.started_at = self.now()
            inst.status_msg = "success, running " + inst.image
            self._set_phase(inst, "running", inst.reason)
            self._on_running(inst)

    def _halt(self, inst: Instance, phase: str, reason: str) -> None:
        self._release(inst)
        inst.endpoints = None
        inst.started_at = None
        inst.generation += 1  # a boot in flight must not bring it back
        self._set_phase(inst, phase, reason)
        self._kill(inst)

    def _kill(self, inst: Instance) -> None:
        if inst.backend_live:
            inst.backend_live = False
            self._ops.submit(inst.key, partial(self.backend.kill, inst.key))

    def _set_phase(self, inst: Instance, phase: str, reason: str) -> None:
        inst.phase, inst.reason, inst.changed_at = phase, reason, self.now()
        self._bill(inst)

    def _bill(self, inst: Instance) -> None:
        gpu, storage = self._rates(inst)
        self.ledger.set_rates(
            inst.key, inst.provider, inst.id, inst.label, self.now(), inst.phase, gpu, storage
        )

    def _rates(self, inst: Instance) -> tuple[float, float]:
        """(GPU, storage) USD per hour for the instance's current state."""
        if inst.phase == "destroyed":
            return 0.0, 0.0
        alive = inst.machine.dead_at is None
        gpu = inst.gpu_rate if inst.phase == "running" and alive else 0.0
        if inst.provider == "vast":
            return gpu, inst.storage_rate  # Vast bills storage from creation, stopped or not
        per_gb_hour = RUNPOD_GB_MONTH / HOURS_PER_MONTH
        if inst.phase in LIVE_PHASES:
            return gpu, (inst.disk_gb + inst.volume_gb) * per_gb_hour
        return gpu, inst.volume_gb * 2 * per_gb_hour  # stopped: the volume only, at twice

    def _gpu_spec(self, inst: Instance) -> GpuSpec:
        machine = inst.machine
        if machine.vendor == "amd":
            return GpuSpec(driver_version=machine.actual_driver, cuda_driver_version=0,
                           devices=[machine.gpus[i] for i in inst.gpu_indices], vendor="amd",
                           rocm_version=rocm_for(machine.actual_driver))
        return GpuSpec(
            driver_version=machine.actual_driver,
            cuda_driver_version=cuda_int(cuda_for(machine.actual_driver)),
            devices=[machine.gpus[i] for i in inst.gpu_indices],
        )

    def box_spec(self, inst: Instance) -> BoxSpec:
        """The container the provider would start: its environment, ports, keys and GPUs."""
        ip = inst.machine.public_ip
        keys = "\n".join(self.ssh_keys[inst.provider])
        if inst.provider == "runpod":
            keys = inst.env.get("PUBLIC_KEY", keys)  # the pod's own PUBLIC_KEY wins
            env = {
                **inst.env,
                "RUNPOD_POD_ID": inst.id,
                "RUNPOD_POD_HOSTNAME": f"{inst.id}-{inst.machine.host_id}",
                "RUNPOD_GPU_COUNT": str(inst.gpu_count),
                "RUNPOD_PUBLIC_IP": ip,
                "PUBLIC_KEY": keys,
            }
            hostname = inst.id
        else:
            env = {
                **inst.env,
                "VAST_CONTAINERLABEL": f"C.{inst.id}",
                "CONTAINER_ID": inst.id,
                "CONTAINER_API_KEY": inst.api_key,
                "PUBLIC_IPADDR": ip,
            }
            hostname = f"C.{inst.id}"
        runpod = inst.provider == "runpod"
        return BoxSpec(
            box_id=inst.key, provider=inst.provider, hostname=hostname, env=env,
            tcp_ports=list(inst.tcp_ports), public_ip=ip, authorized_keys=keys,
            gpu=inst.gpu or self._gpu_spec(inst), start_hook=inst.start_hook,
            # shared/research/providers.md "Disks": RunPod drops the container disk on every
            # stop and restart and keeps the volume; Vast keeps its one disk
            disk_gb=inst.disk_gb, disk_kept=not runpod,
            volume_gb=inst.volume_gb if runpod else 0.0,
            volume_path=inst.extra.get("volumeMountPath") if runpod and inst.volume_gb else None,
            sshd_hung=inst.sshd_hung, ssh_cut=inst.provider in self.ssh_cut,
        )

    # -- views for the control surface -------------------------------------------------------

    def describe(self, inst: Instance) -> dict[str, Any]:
        ep = inst.endpoints
        return {
            "provider": inst.provider,
            "id": inst.id,
            "box_id": inst.key,
            "label": inst.label,
            "phase": inst.phase,
            "machine_id": inst.machine.machine_id,
            "card": inst.machine.card.display,
            "gpu_count": inst.gpu_count,
            "public_ip": inst.machine.public_ip,
            "driver_advertised": inst.machine.driver,
            "driver_actual": inst.machine.actual_driver,
            "host_dead": inst.machine.dead_at is not None,
            "ssh_host": ep.ssh_host if ep else None,
            "ssh_port": ep.ssh_port if ep else None,
            "ports": {str(k): v for k, v in ep.ports.items()} if ep else {},
            "host_key": ep.host_key if ep else None,
            "restarts": inst.restarts,
            "sshd_hung": inst.sshd_hung,
            "ssh_path_cut": inst.provider in self.ssh_cut,
            "account": inst.account,
        }

    def create_many(
        self, provider: str, count: int, *, label_prefix: str = "bulk", image: str = "sandbox",
        gpu_count: int = 1, tcp_ports: Iterable[int] = (22,), disk_gb: float = 20.0,
        env: dict[str, str] | None = None,
    ) -> list[Instance]:
        """Rent `count` boxes straight into the world, one per machine with room (benchmarks)."""
        made: list[Instance] = []
        with self.lock:
            for machine in self.machines[provider]:
                if len(made) == count:
                    break
                if machine.free_gpus < gpu_count:
                    continue
                storage = 0.0 if provider == "runpod" else vast_storage_rate(disk_gb)
                inst = self.create(
                    provider, machine, gpu_count, image=image,
                    label=f"{label_prefix}-{len(made):04d}", env=env or {},
                    tcp_ports=tcp_ports, disk_gb=disk_gb, gpu_rate=machine.price * gpu_count,
                    storage_rate=storage,
                )
                if provider == "runpod":  # as its API path records them: ports get published
                    inst.extra["tcp_requested"] = list(tcp_ports)
                made.append(inst)
        if len(made) < count:
            raise WorldError("no_capacity", f"only {len(made)} of {count} boxes fit")
        return made


def new_key(provider: str) -> str:
    """A fresh API key in the provider's own form."""
    return "rpa_" + secrets.token_hex(20).upper() if provider == "runpod" else secrets.token_hex(32)


VAST_STORAGE_GB_MONTH = 0.15  # Vast storage_cost in the sandbox (USD per GB per month)


def vast_storage_rate(disk_gb: float) -> float:
    """Vast's storage_total_cost (USD/h) for `disk_gb`: storage_cost x GB / 720."""
    return VAST_STORAGE_GB_MONTH * disk_gb / HOURS_PER_MONTH
