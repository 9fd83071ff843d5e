"""The simulated cloud: the sandbox's own provider APIs, called in-process over one `World`
on the simulation's clock, with the ground truth the invariants are checked against.

The fleet's real provider clients talk to the sandbox's `VastApp` and `RunpodApp` through an
httpx transport that calls them in-process (no sockets, no threads of ours). SSH is simulated
at its edges: the loop's checks, its deploys and the host-key read answer from the ground
truth (a box running, its host alive, its sshd not hung, the operator's path to its provider
not cut, its agent installed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx

from fleet.boxes.boxssh import KEY_REFUSED
from fleet.core.verdicts import Health
from fleet.providers import runpod, vast
from fleet.providers.http import Http, RetryPolicy
from fleet.providers.keys import Secret
from sandbox.backend import NullBackend
from sandbox.httpbase import Request, Response
from sandbox.runpod_api import RunpodApp
from sandbox.vast_api import VastApp
from sandbox.world import Instance, World

App = Callable[[Request], Response]
KEYS = {"vast": "sim-vast-key", "runpod": "sim-runpod-key"}
BASE = {"vast": "http://vast.sim", "runpod": "http://runpod.sim"}


class Killed(BaseException):  # noqa: N818 - a SIGKILL, not an error: nothing may catch it
    """The loop's process killed between two of its actions."""


@dataclass
class Action:
    """One provider call that changed the world (a create or a destroy), as the loop made it."""

    fleet: str  # which loop made it ("main", "second")
    kind: str  # "create" | "destroy"
    key: str  # the instance ("vast-123")
    label: str
    at: float
    phase_before: str = ""  # a destroy: what the provider had the box as


@dataclass
class Truth:
    """What the simulator knows that the fleet can only observe."""

    converted: set[str] = field(default_factory=set)  # instance keys with the agent installed
    hung: set[str] = field(default_factory=set)  # instance keys whose sshd never runs a command
    cut: set[str] = field(default_factory=set)  # providers the operator's SSH cannot reach
    blind: set[str] = field(default_factory=set)  # providers whose key lists an empty account
    owners: dict[str, str] = field(default_factory=dict)  # instance key -> the fleet that made it
    # instance key -> how many times its SSH host key changed (0: the key it booted with)
    rekeyed: dict[str, int] = field(default_factory=dict)
    # host keys that appeared with no restart of their box: another host, for all the fleet
    # can tell; never to be pinned (I10)
    unvouched: set[str] = field(default_factory=set)


class Cloud:
    def __init__(self, seed: int, clock: Callable[[], float],
                 sleep: Callable[[float], None]) -> None:
        self.world = World(seed=seed, machines_per_provider=10, backend=NullBackend(),
                           boot_delay=20.0, notice_delay=30.0, clock=clock)
        self.world.billing_delay = 60.0
        self.apps: dict[str, App] = {"vast": VastApp(self.world, KEYS["vast"]),
                     "runpod": RunpodApp(self.world, KEYS["runpod"])}
        # an account with no boxes: where a key that now points elsewhere lists
        self.empty = World(seed=seed + 1, machines_per_provider=1, backend=NullBackend(),
                           clock=clock)
        self.empty_apps: dict[str, App] = {"vast": VastApp(self.empty, KEYS["vast"]),
                           "runpod": RunpodApp(self.empty, KEYS["runpod"])}
        self.truth = Truth()
        self.sleep = sleep
        self.actions: list[Action] = []
        # called after each action the loop made (the invariants), and before each mutating
        # call (the kill switch)
        self.after_action: Callable[[Action], None] = lambda a: None
        self.before_mutation: Callable[[], None] = lambda: None

    # -- the providers, as the fleet's own clients see them -----------------------------------

    def providers(self, fleet: str = "main") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, cls in (("vast", vast.Vast), ("runpod", runpod.RunPod)):
            http = Http(name, BASE[name], Secret(KEYS[name]), timeout=30.0,
                        retry=RetryPolicy(attempts=3, base_delay=0.5, max_delay=4.0),
                        sleep=self.sleep, rand=lambda: 0.5,
                        transport=httpx.MockTransport(self._handler(name, fleet)))
            out[name] = cls(http, destroy_polls=3, poll_interval=1.0)
        return out

    def _handler(self, provider: str, fleet: str) -> Callable[[httpx.Request], httpx.Response]:
        def handle(request: httpx.Request) -> httpx.Response:
            url = urlsplit(str(request.url))
            body = request.read()
            req = Request(request.method, url.path, dict(parse_qsl(url.query)),
                          {k.lower(): v for k, v in request.headers.items()}, body)
            mutating = _mutating(provider, req)
            if mutating:
                self.before_mutation()
            app = self.empty_apps if provider in self.truth.blind else self.apps
            before = self._phases()
            resp = app[provider](req)
            self.world.tick()
            self.world.settle()
            if mutating:
                self._record(fleet, before)
            if resp.drop:  # the create landed (or not); the answer never comes
                raise httpx.ReadTimeout("the connection was closed", request=request)
            if resp.delay:
                self.sleep(resp.delay)
            return httpx.Response(resp.status, headers={"content-type": resp.content_type,
                                                        **resp.headers}, content=resp.body)
        return handle

    def _phases(self) -> dict[str, str]:
        return {k: i.phase for k, i in self.world.instances.items()}

    def _record(self, fleet: str, before: dict[str, str]) -> None:
        now = self.world.now()
        for key, inst in self.world.instances.items():
            was = before.get(key)
            if was is None:
                self.truth.owners[key] = fleet
                self._act(Action(fleet, "create", key, inst.label, now))
            elif inst.phase == "destroyed" and was != "destroyed":
                self._act(Action(fleet, "destroy", key, inst.label, now, was))

    def _act(self, action: Action) -> None:
        self.actions.append(action)
        self.after_action(action)

    # -- the world's own steps ---------------------------------------------------------------

    def step(self) -> None:
        self.world.tick()
        self.world.settle()

    def instance(self, provider: str, box_id: str | None) -> Instance | None:
        if not box_id:
            return None
        return self.world.instances.get(f"{provider}-{box_id}")

    def by_label(self, label: str) -> list[Instance]:
        return [i for i in self.world.instances.values()
                if i.label == label and i.phase != "destroyed"]

    # -- ground truth ----------------------------------------------------------------------

    def answers_ssh(self, inst: Instance | None) -> bool:
        """Whether the operator's SSH runs a command on the box now."""
        return (inst is not None and inst.phase == "running" and inst.endpoints is not None
                and inst.machine.dead_at is None and inst.key not in self.truth.hung
                and inst.provider not in self.truth.cut)

    def alive(self, inst: Instance | None) -> bool:
        """A box that would answer SSH but for the operator's own path to it."""
        return (inst is not None and inst.phase == "running" and inst.endpoints is not None
                and inst.machine.dead_at is None and inst.key not in self.truth.hung)

    def healthy(self, inst: Instance | None) -> bool:
        """A standing box that serves: running, its host alive, its sshd sane and its agent
        installed (whether the operator can reach it or not)."""
        return (inst is not None and inst.phase == "running" and inst.machine.dead_at is None
                and inst.key not in self.truth.hung and inst.key in self.truth.converted
                and self.served_key(inst) not in self.truth.unvouched)

    def served_key(self, inst: Instance) -> str:
        """The host key the box's sshd serves now."""
        gen = self.truth.rekeyed.get(inst.key, 0)
        return f"ssh-ed25519 AAAASIM{inst.key.replace('-', '')}" + (f"k{gen}" if gen else "")

    def rekey(self, inst: Instance) -> str:
        """The box's sshd serves a new host key from now on, with no restart its provider
        lists: for all the fleet can tell, another host at the box's address."""
        self.truth.rekeyed[inst.key] = self.truth.rekeyed.get(inst.key, 0) + 1
        key = self.served_key(inst)
        self.truth.unvouched.add(key)
        return key

    def host_key(self, host: str, port: int, timeout: float = 5.0) -> str:
        from fleet.core.errors import FleetError
        inst = self._at(host, port)
        if not self.answers_ssh(inst):
            raise FleetError(f"ssh-keyscan {host}:{port}: no host key")
        assert inst is not None
        return self.served_key(inst)

    def _at(self, host: str, port: int) -> Instance | None:
        for inst in self.world.instances.values():
            e = inst.endpoints
            if e is not None and e.ssh_host == host and e.ssh_port == port \
                    and inst.phase != "destroyed":
                return inst
        return None

    def check(self, _cfg: Any, built: Any) -> list[Health]:
        """The loop's SSH check of each standing host, from the ground truth."""
        out = []
        for label, data in built.groups.get("standing", []):
            inst = self.instance(str(data.get("provider")), data.get("provider_id"))
            h = Health(label, str(data.get("provider")))
            if inst is not None and inst.key in self.truth.hung and inst.phase == "running" \
                    and inst.provider not in self.truth.cut:
                h.problems = ["ssh: connected, but the command did not start within 75 s"]
                h.hung = True
            elif not self.answers_ssh(inst):
                h.problems = ["ssh: box did not answer"]
            elif inst is not None and data.get("host_key") != self.served_key(inst):
                h.problems = [f"ssh: {KEY_REFUSED}"]  # a strict check refuses it
            elif inst is not None and inst.key not in self.truth.converted:
                h.ssh = True
                h.problems = ["agent: not installed"]
            else:
                h.ssh = h.agent = True
                h.synced = True
            out.append(h)
        return out

    def converge(self, cfg: Any, labels: list[str]) -> str | None:
        """The standing deploy and its checks on `labels`: each box that answers SSH gets its
        agent; a failure names the others."""
        from fleet.state.registry import Registry
        reg = Registry(cfg.registry)
        failed = []
        for label in labels:
            row = reg.get(label)
            inst = self.instance(row.provider, row.provider_id) if row else None
            if row is not None and self.answers_ssh(inst):
                assert inst is not None
                self.truth.converted.add(inst.key)
                reg.update(label, standing=True, standing_since=row.standing_since
                           or _iso(self.world.now()))
            else:
                failed.append(label)
        return f"unreachable: {', '.join(failed)}" if failed else None


def _mutating(provider: str, req: Request) -> bool:
    if provider == "vast":
        return req.method in ("PUT", "DELETE") and (
            "/asks/" in req.path or "/instances/" in req.path)
    if req.method != "POST":
        return False
    try:
        return json.loads(req.body or b"{}").get("query", "").lstrip().startswith("mutation")
    except ValueError:
        return False


def _iso(epoch: float) -> str:
    from datetime import UTC, datetime

    from fleet.core.times import iso
    return iso(datetime.fromtimestamp(epoch, UTC))
