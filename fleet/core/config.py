"""fleet.toml: load and validate the fleet description.

Every mistake (unknown key, wrong type, unknown role or provider) becomes one `ConfigError`
line naming the file and the key, so the CLI can print it and exit 2 having changed nothing.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.contract import MINER, NODE, PROGRAMS, PROVER
from fleet.core import cards, paths
from fleet.core.errors import ConfigError, UsageError
from fleet.core.states import BoxKind

PROVIDERS = ("runpod", "vast")
KEY_ENV = {"runpod": "RUNPOD_API_KEY", "vast": "VAST_API_KEY"}  # where each key is read first
KINDS = tuple(BoxKind)
# programs gated by admission unless a role says otherwise (`gpu_programs`)
GPU_PROGRAMS = (MINER, PROVER)
NODE_UNHEALTHY_RESTART_S = 300.0
DAY_S = 86400.0
# the longest each duration may be: a slip (1e10) is refused at load, not left to overflow a
# sleep or a deadline, or to make a loop that never looks again
LOOP_MAX_S = {"interval_s": 3600.0, "orphan_grace_s": DAY_S, "converge_timeout_s": DAY_S,
              "ready_timeout_s": DAY_S, "move_timeout_s": 7 * DAY_S, "restart_timeout_s": DAY_S,
              "disruption_window_s": 7 * DAY_S}
NODE_UNHEALTHY_RESTART_MAX_S = DAY_S
READY_TIMEOUT_MIN_S = 300.0
DRIVER = re.compile(r"^\d+\.\d+\.\d+$")
CUDA = re.compile(r"^\d+\.\d+$")
ROCM = CUDA  # a ROCm release line an offer may carry: "6.4"
# a role name starts every label the fleet makes (`<role>-<fleet id>-<provider>-<6 hex>[-r<n>]`,
# see fleet/labels.py), which must stay within 60 characters and one DNS-like form
ROLE_NAME = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")
ROLE_NAME_MAX = 20


@dataclass(frozen=True)
class Role:
    name: str
    kind: BoxKind
    image: str
    disk_gb: int
    programs: tuple[str, ...] = ()
    p2p_port: int | None = None
    admitted_driver: str | None = None
    qualified_gpus: tuple[str, ...] = ()
    release: str | None = None
    allowed_cuda: tuple[str, ...] = ()
    # AMD boxes: the exact amdgpu driver and ROCm release their GPU programs run on, and the
    # ROCm release lines offers may carry (as allowed_cuda for NVIDIA)
    admitted_amdgpu: str | None = None
    admitted_rocm: str | None = None
    allowed_rocm: tuple[str, ...] = ()
    gpu_programs: tuple[str, ...] = GPU_PROGRAMS  # run only where admission passes
    node_unhealthy_restart_s: float = NODE_UNHEALTHY_RESTART_S  # 0 = report only
    # one-shot jobs: symbol/kernel name globs (case-insensitive) a scanned module may not hold,
    # and the exceptions to them
    banned_symbols: tuple[str, ...] = ()
    allowed_symbols: tuple[str, ...] = ()
    # standing boxes of the role on distinct machines (Vast) or data centers (RunPod Secure
    # Cloud) where the provider names them (`fleet.ops.spread`); false: cheapest wherever
    spread: bool = True

    @property
    def tcp_ports(self) -> tuple[int, ...]:
        return (22, self.p2p_port) if self.p2p_port else (22,)

    def needs_gpu(self, program: str) -> bool:
        return program in self.programs and program in self.gpu_programs

    @property
    def uses_gpu(self) -> bool:
        """Whether its boxes run GPU work: a GPU program, or a one-shot job."""
        return self.kind == BoxKind.ONESHOT or any(self.needs_gpu(p) for p in self.programs)

    def check_gpu_guard(self, vendor: str | None = None) -> None:
        """GPU work runs only on a named driver: a GPU program (or a one-shot role, whose job
        is GPU work) without the one its box's vendor needs is a config error. `vendor` is the
        box's card's ("nvidia", "amd"); None (no card known) keeps the NVIDIA rule unless the
        role names the AMD pair. A vendor the fleet cannot tell is refused, never defaulted."""
        if not self.uses_gpu:
            return
        if vendor not in (None, *cards.VENDORS):
            raise ConfigError(f"roles.{self.name}: the card's vendor cannot be told; GPU work "
                              "runs only where its library is known")
        if vendor == cards.AMD:
            if self.kind == BoxKind.ONESHOT:
                raise ConfigError(f"roles.{self.name}: one-shot jobs run on NVIDIA cards only")
            if not (self.admitted_amdgpu and self.admitted_rocm):
                raise ConfigError(
                    f"roles.{self.name}: {self.gpu_work()} needs the GPU but admitted_amdgpu "
                    "and admitted_rocm are not set; name the exact amdgpu driver and ROCm "
                    "release it may run on (e.g. \"6.12.12\" and \"6.4.1\")")
            return
        if (self.admitted_driver or "").strip():
            return
        if vendor is None and self.kind != BoxKind.ONESHOT and self.admitted_amdgpu:
            return  # an AMD-only role (the pair is checked whole at load)
        if self.kind == BoxKind.ONESHOT:
            raise ConfigError(
                f"roles.{self.name}: one-shot jobs run GPU work but admitted_driver is not "
                "set; name the exact NVIDIA driver they may run on (e.g. \"580.95.05\")")
        raise ConfigError(
            f"roles.{self.name}: {self.gpu_work()} needs the GPU but admitted_driver is not "
            "set; name the exact NVIDIA driver it may run on (e.g. \"580.95.05\")")

    def gpu_work(self) -> str:
        return next((p for p in self.programs if self.needs_gpu(p)), "the one-shot job")


@dataclass(frozen=True)
class Want:
    role: str
    provider: str
    card: str
    gpus: int
    count: int


@dataclass(frozen=True)
class LoopSettings:
    """fleet.toml `[loop]`: how `fleet loop` keeps the standing fleet up."""

    interval_s: float = 60.0  # seconds between the starts of two ticks
    dead_checks: int = 2  # consecutive dead checks before a standing box is replaced
    orphan_grace_s: float = 600.0  # an orphan is destroyed once seen this long
    converge_timeout_s: float = 1800.0  # a deploy or check run longer than this has failed
    ready_timeout_s: float = 1800.0  # a rented box not SSH-ready this long is given up
    # a box a move rented (`fleet.ops.spread`) not well and synced this long is given up
    move_timeout_s: float = 6 * 3600.0
    # a box its provider lists as provisioning whose SSH does not answer is restarting on the
    # provider's side: no death before this long
    restart_timeout_s: float = 900.0
    # the disruption budget (`fleet.ops.disruption`): a role loses at most max(1, this
    # fraction of its wanted boxes) to the loop's own judgement within the window
    disruption_fraction: float = 0.25
    disruption_window_s: float = 3600.0


@dataclass(frozen=True)
class Config:
    path: Path
    registry: Path
    known_hosts: Path
    ssh_key: Path
    releases: Path
    daily_budget_usd: float
    roles: dict[str, Role]
    roster: tuple[Want, ...]
    store: dict[str, str] = field(default_factory=dict)
    loop: LoopSettings = field(default_factory=LoopSettings)
    # `[networks.<name>]`: the roles whose nodes form one mesh; a role named in none is a
    # network of its own, named after it (`network_of`)
    networks: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def role(self, name: str) -> Role:
        try:
            return self.roles[name]
        except KeyError:
            known = ", ".join(sorted(self.roles)) or "none"
            raise ConfigError(f"unknown role {name!r} (roles: {known})") from None

    def network_of(self, role: str) -> str:
        """The network whose mesh the boxes of `role` join: the one naming it, else its own.
        A role fleet.toml no longer names is a mesh apart, under a name no network can take
        (a retired role `dn2` beside `[networks.dn2]` must not join its mesh)."""
        if role not in self.roles:
            return f"{role} (not in fleet.toml)"
        return next((n for n, roles in self.networks.items() if role in roles), role)

    def network_roles(self, network: str) -> tuple[str, ...]:
        """The roles of `network` (a role in no network is the one role of its own)."""
        return self.networks.get(network, (network,))


def host_network(data: Mapping[str, Any]) -> str:
    """The network of a box's inventory host data: the mesh whose other boxes are its mates
    (host data without one, its role's own)."""
    return str(data.get("network") or data.get("role"))


def _check(where: str, table: dict[str, Any], spec: dict[str, tuple[type, ...]],
           required: tuple[str, ...] = ()) -> None:
    for key, value in table.items():
        if key not in spec:
            raise ConfigError(f"{where}: unknown key {key!r}")
        types = spec[key]
        # bool is an int in Python; refuse it where a number is wanted
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"{where}.{key}: expected {names}, got {type(value).__name__}")
        # TOML spells nan and inf, and no setting means either: a nan grace is none, a nan
        # interval a busy loop, an inf budget no budget at all
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}.{key}: must be a finite number, got {value}")
    for key in required:
        if key not in table:
            raise ConfigError(f"{where}: missing key {key!r}")


def _strings(where: str, values: list[Any]) -> tuple[str, ...]:
    for v in values:
        if not isinstance(v, str):
            raise ConfigError(f"{where}: expected a list of strings, found {v!r}")
    return tuple(values)


_ROLE_SPEC: dict[str, tuple[type, ...]] = {
    "kind": (str,), "image": (str,), "disk_gb": (int,), "programs": (list,),
    "p2p_port": (int,), "admitted_driver": (str,), "qualified_gpus": (list,),
    "release": (str,), "allowed_cuda": (list,), "gpu_programs": (list,),
    "node_unhealthy_restart_s": (int, float), "banned_symbols": (list,),
    "allowed_symbols": (list,), "spread": (bool,),
    "admitted_amdgpu": (str,), "admitted_rocm": (str,), "allowed_rocm": (list,),
}


def _check_name(where: str, what: str, name: str, why: str = "") -> None:
    """A role's or a network's name: the one form labels can carry."""
    if not ROLE_NAME.match(name) or len(name) > ROLE_NAME_MAX:
        raise ConfigError(
            f"{where}: bad {what} name {name!r}: lowercase letters and digits, words joined by "
            f"single hyphens, starting with a letter, at most {ROLE_NAME_MAX} characters{why}")


def _role(name: str, table: Any, src: str) -> Role:
    where = f"{src}: roles.{name}"
    _check_name(where, "role", name, " (it starts every label of the role's boxes)")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    _check(where, table, _ROLE_SPEC, required=("kind", "image", "disk_gb"))
    if table["kind"] not in KINDS:
        raise ConfigError(
            f"{where}.kind: expected one of {', '.join(KINDS)}, got {table['kind']!r}")
    programs = _strings(f"{where}.programs", table.get("programs", []))
    for p in programs:
        if p not in PROGRAMS:
            raise ConfigError(f"{where}.programs: unknown program {p!r}")
    port = table.get("p2p_port")
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"{where}.p2p_port: {port} is not a TCP port")
    if table["disk_gb"] < 8:
        raise ConfigError(f"{where}.disk_gb: at least 8 GB, got {table['disk_gb']}")
    named = _gpu_programs(where, table, programs)
    _check_nvidia(where, table)
    amd = _amd(where, table)
    restart = _restart_s(where, table)
    role = Role(
        name=name, kind=BoxKind(table["kind"]), image=table["image"], disk_gb=table["disk_gb"],
        programs=programs, p2p_port=port, admitted_driver=table.get("admitted_driver"),
        qualified_gpus=_strings(f"{where}.qualified_gpus", table.get("qualified_gpus", [])),
        release=table.get("release"),
        allowed_cuda=_strings(f"{where}.allowed_cuda", table.get("allowed_cuda", [])),
        gpu_programs=tuple(p for p in programs if p in named),
        node_unhealthy_restart_s=restart,
        banned_symbols=_strings(f"{where}.banned_symbols", table.get("banned_symbols", [])),
        allowed_symbols=_strings(f"{where}.allowed_symbols", table.get("allowed_symbols", [])),
        spread=table.get("spread", True),
        **amd,
    )
    try:
        role.check_gpu_guard()
    except ConfigError as e:
        raise ConfigError(f"{src}: {e}") from None
    return role


def _gpu_programs(where: str, table: dict[str, Any], programs: tuple[str, ...]
                  ) -> tuple[str, ...]:
    """The programs the role names as GPU work (each one of its programs), or the default."""
    if "gpu_programs" not in table:
        return GPU_PROGRAMS
    named = _strings(f"{where}.gpu_programs", table["gpu_programs"])
    for p in named:
        if p not in programs:
            raise ConfigError(f"{where}.gpu_programs: {p!r} is not one of the role's programs")
    return named


def _check_nvidia(where: str, table: dict[str, Any]) -> None:
    """The admitted NVIDIA driver (an exact version) and the CUDA versions offers may carry."""
    driver = table.get("admitted_driver")
    if driver is not None and driver.strip() and not DRIVER.match(driver.strip()):
        # refused now, not when the loop's first search (maybe days later) sends it to Vast
        raise ConfigError(f"{where}.admitted_driver: {driver!r} is not an exact NVIDIA driver "
                          "version X.Y.Z (e.g. \"580.95.05\")")
    for cuda in _strings(f"{where}.allowed_cuda", table.get("allowed_cuda", [])):
        if not CUDA.match(cuda):
            raise ConfigError(f"{where}.allowed_cuda: {cuda!r} is not a CUDA version X.Y "
                              "(e.g. \"13.0\")")


def _restart_s(where: str, table: dict[str, Any]) -> float:
    """How long an unhealthy node runs before the agent restarts it (0: report only)."""
    restart = table.get("node_unhealthy_restart_s", NODE_UNHEALTHY_RESTART_S)
    if restart < 0:
        raise ConfigError(
            f"{where}.node_unhealthy_restart_s: must be 0 (report only) or more, got {restart}")
    if restart > NODE_UNHEALTHY_RESTART_MAX_S:
        raise ConfigError(f"{where}.node_unhealthy_restart_s: at most "
                          f"{NODE_UNHEALTHY_RESTART_MAX_S:g} s, got {restart:g}")
    return float(restart)


def _amd(where: str, table: dict[str, Any]) -> dict[str, Any]:
    """The role's AMD settings, each checked: the exact pair comes whole or not at all, and the
    ROCm lines offers may carry hold the admitted release's (by default, only that line): a
    search on other lines would find only hosts the agent refuses."""
    amdgpu, rocm = table.get("admitted_amdgpu"), table.get("admitted_rocm")
    named = [k for k in ("admitted_amdgpu", "admitted_rocm", "allowed_rocm") if k in table]
    if named and table["kind"] == "oneshot":
        raise ConfigError(f"{where}.{named[0]}: one-shot jobs run on NVIDIA cards only")
    if amdgpu is not None and not DRIVER.match(amdgpu):
        raise ConfigError(f"{where}.admitted_amdgpu: {amdgpu!r} is not an exact amdgpu driver "
                          "version X.Y.Z (e.g. \"6.12.12\")")
    if rocm is not None and not DRIVER.match(rocm):
        raise ConfigError(f"{where}.admitted_rocm: {rocm!r} is not an exact ROCm release X.Y.Z "
                          "(e.g. \"6.4.1\")")
    if (amdgpu is None) != (rocm is None):
        have, lacks = ("admitted_amdgpu", "admitted_rocm") if rocm is None else (
            "admitted_rocm", "admitted_amdgpu")
        raise ConfigError(f"{where}: {have} without {lacks}; an AMD box is admitted on the "
                          "exact pair")
    allowed = _strings(f"{where}.allowed_rocm", table.get("allowed_rocm", []))
    for line in allowed:
        if not ROCM.match(line):
            raise ConfigError(f"{where}.allowed_rocm: {line!r} is not a ROCm release X.Y "
                              "(e.g. \"6.4\")")
    if rocm is None:
        if allowed:
            raise ConfigError(f"{where}.allowed_rocm: set without admitted_amdgpu and "
                              "admitted_rocm, the exact pair an AMD box is admitted on")
        return {"admitted_amdgpu": None, "admitted_rocm": None, "allowed_rocm": ()}
    line = ".".join(rocm.split(".")[:2])
    if allowed and line not in allowed:
        raise ConfigError(f"{where}.allowed_rocm: {list(allowed)} leaves out {line}, the line "
                          f"of admitted_rocm {rocm}: every host found would be refused")
    return {"admitted_amdgpu": amdgpu, "admitted_rocm": rocm, "allowed_rocm": allowed or (line,)}


def _wants(role: Role, entries: Any, src: str) -> list[Want]:
    where = f"{src}: roster.{role.name}"
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: expected an array of tables ([[roster.{role.name}]])")
    wants: list[Want] = []
    for i, e in enumerate(entries):
        w = f"{where}[{i}]"
        if not isinstance(e, dict):
            raise ConfigError(f"{w}: expected a table")
        _check(w, e, {"provider": (str,), "card": (str,), "gpus": (int,), "count": (int,)},
               required=("provider", "card"))
        if e["provider"] not in PROVIDERS:
            raise ConfigError(f"{w}.provider: expected one of {', '.join(PROVIDERS)}, "
                              f"got {e['provider']!r}")
        gpus, count = e.get("gpus", 1), e.get("count", 1)
        if gpus < 1 or count < 0:
            raise ConfigError(f"{w}: gpus must be >= 1 and count >= 0")
        # the registry records the fleet's name for a card: a roster in another spelling
        # ("rtx 4090", RunPod's "NVIDIA GeForce RTX 4090") would never count as filled
        card = cards.canonical(e["card"])
        if card is None:
            raise ConfigError(f"{w}.card: unknown card {e['card']!r} (known: {cards.known()})")
        _guard_card(role, card, w)
        twin = next((x for x in wants if (x.provider, x.card, x.gpus) ==
                     (e["provider"], card, gpus)), None)
        if twin is not None:
            # each would be counted against the same boxes: the roster would mean the larger
            raise ConfigError(f"{w}: the same {e['provider']} {card} x{gpus} as an earlier "
                              "entry; give one entry the sum of their counts")
        wants.append(Want(role.name, e["provider"], card, gpus, count))
    return wants


def _guard_card(role: Role, card: str, where: str) -> None:
    """The role's GPU guard for a box of `card`: one line naming the roster entry."""
    vendor = cards.vendor(card)
    try:
        role.check_gpu_guard(vendor)
    except ConfigError as e:
        why = str(e).split(": ", 1)[1]
        if vendor == cards.AMD and role.kind == BoxKind.ONESHOT:
            raise ConfigError(f"{where}: {card} is an AMD card; {why}") from None
        name = "AMD" if vendor == cards.AMD else "NVIDIA"
        lacks = "admitted_amdgpu and admitted_rocm" if vendor == cards.AMD else "admitted_driver"
        raise ConfigError(f"{where}: {card} is an {name} card and {role.gpu_work()} needs the "
                          f"GPU, but roles.{role.name} names no {lacks}") from None


def _networks(data: Any, roles: dict[str, Role], src: str) -> dict[str, tuple[str, ...]]:
    """`[networks.<name>] roles = [...]`: roles whose boxes form one mesh, each box carrying
    its role's duties (programs). Every role of a network is standing, runs the node and has a
    p2p port; a role belongs to at most one network."""
    out: dict[str, tuple[str, ...]] = {}
    member: dict[str, str] = {}
    for name, table in data.items():
        where = f"{src}: networks.{name}"
        _check_name(where, "network", name)
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: expected a table")
        _check(where, table, {"roles": (list,)}, required=("roles",))
        names = _strings(f"{where}.roles", table["roles"])
        if not names:
            raise ConfigError(f"{where}.roles: a network needs at least one role")
        for r in names:
            role = roles.get(r)
            if role is None:
                raise ConfigError(f"{where}.roles: unknown role {r!r}")
            if r in member:
                raise ConfigError(f"{where}.roles: role {r!r} is already in network "
                                  f"{member[r]!r}; a role belongs to at most one network")
            if role.kind != BoxKind.STANDING or NODE not in role.programs or not role.p2p_port:
                raise ConfigError(f"{where}.roles: role {r!r} must be standing, run the node "
                                  "and have a p2p_port to join a network's mesh")
            member[r] = name
        out[name] = names
    for name in out:
        if name in roles and member.get(name) != name:
            # a role in no network is the network of its name: the two would be one mesh
            raise ConfigError(f"{src}: networks.{name}: the name of role {name!r}, which is "
                              "not in it; name the network otherwise")
    return out


def _loop(table: dict[str, Any], src: str) -> LoopSettings:
    where = f"{src}: loop"
    _check(where, table, {"dead_checks": (int,), "disruption_fraction": (int, float),
                          **{k: (int, float) for k in LOOP_MAX_S}})
    for key, most in LOOP_MAX_S.items():
        if table.get(key, 0) > most:
            raise ConfigError(f"{where}.{key}: at most {most:g} s, got {table[key]:g}")
    d = LoopSettings()
    loop = LoopSettings(
        interval_s=float(table.get("interval_s", d.interval_s)),
        dead_checks=int(table.get("dead_checks", d.dead_checks)),
        orphan_grace_s=float(table.get("orphan_grace_s", d.orphan_grace_s)),
        converge_timeout_s=float(table.get("converge_timeout_s", d.converge_timeout_s)),
        ready_timeout_s=float(table.get("ready_timeout_s", d.ready_timeout_s)),
        move_timeout_s=float(table.get("move_timeout_s", d.move_timeout_s)),
        restart_timeout_s=float(table.get("restart_timeout_s", d.restart_timeout_s)),
        disruption_fraction=float(table.get("disruption_fraction", d.disruption_fraction)),
        disruption_window_s=float(table.get("disruption_window_s", d.disruption_window_s)))
    for key in ("interval_s", "converge_timeout_s", "ready_timeout_s", "move_timeout_s",
                "restart_timeout_s", "disruption_window_s"):
        if getattr(loop, key) <= 0:
            raise ConfigError(f"{where}.{key}: must be positive, got {getattr(loop, key):g}")
    if not 0 < loop.disruption_fraction <= 1:
        raise ConfigError(f"{where}.disruption_fraction: more than 0 and at most 1, got "
                          f"{loop.disruption_fraction:g}")
    if loop.dead_checks < 1:
        raise ConfigError(f"{where}.dead_checks: at least 1, got {loop.dead_checks}")
    if loop.ready_timeout_s < READY_TIMEOUT_MIN_S:
        # shorter, a box still pulling its image would be destroyed and rented again each tick
        raise ConfigError(f"{where}.ready_timeout_s: at least {READY_TIMEOUT_MIN_S:g} s, got "
                          f"{loop.ready_timeout_s:g}")
    problem = grace_problem(loop.orphan_grace_s, loop.interval_s)
    if problem:
        raise ConfigError(f"{where}.orphan_grace_s: {problem}")
    return loop


def grace_problem(orphan_grace_s: float, interval_s: float) -> str | None:
    """Why an orphan grace is too short for the loop's interval, or None: an orphan is destroyed
    no sooner than two ticks after the one that first saw it."""
    if orphan_grace_s >= 2 * interval_s:
        return None
    return (f"must be at least two interval_s ({2 * interval_s:g} s), got {orphan_grace_s:g} s "
            f"with interval_s {interval_s:g} s")


def parse(data: dict[str, Any], path: Path) -> Config:
    src = str(path)
    _check(src, data, {"fleet": (dict,), "store": (dict,), "roles": (dict,), "roster": (dict,),
                       "loop": (dict,), "networks": (dict,)})
    top = data.get("fleet", {})
    _check(f"{src}: fleet", top, {"registry": (str,), "database": (str,),
                                  "known_hosts": (str,), "ssh_key": (str,),
                                  "releases": (str,), "daily_budget_usd": (int, float)})
    store = data.get("store", {})
    _check(f"{src}: store", store, {"repo": (str,), "archive": (str,), "endpoint": (str,)})
    roles = {name: _role(name, t, src) for name, t in data.get("roles", {}).items()}
    roster: list[Want] = []
    for role, entries in data.get("roster", {}).items():
        if role not in roles:
            raise ConfigError(f"{src}: roster.{role}: unknown role {role!r}")
        roster.extend(_wants(roles[role], entries, src))
    networks = _networks(data.get("networks", {}), roles, src)
    loop = _loop(data.get("loop", {}), src)
    budget = float(top.get("daily_budget_usd", 100.0))
    if budget <= 0:
        raise ConfigError(f"{src}: fleet.daily_budget_usd: must be positive, got {budget}")
    base = path.parent

    def rel(key: str, default: str) -> Path:
        p = Path(os.path.expanduser(top.get(key, default)))
        return p if p.is_absolute() else base / p

    registry = rel("registry", "state/boxes.json")
    if "database" in top:
        paths.bind_database(registry, _database(top["database"], base, src))
    return Config(
        path=path, registry=registry,
        known_hosts=rel("known_hosts", "state/known_hosts"),
        ssh_key=rel("ssh_key", "state/ssh/fleet_ed25519"),
        releases=rel("releases", "state/releases"),
        daily_budget_usd=budget, roles=roles, roster=tuple(roster),
        store={k: str(v) for k, v in store.items()}, loop=loop, networks=networks,
    )


def _database(value: str, base: Path, src: str) -> str:
    """fleet.toml's `fleet.database`: a URL (sqlite:///..., postgresql://...) or a path of a
    SQLite file, relative to fleet.toml."""
    if "://" in value:
        if not value.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise ConfigError(f"{src}: fleet.database: {value.split('://')[0]}:// is neither "
                              "sqlite:/// nor postgresql://")
        return value
    if not value.strip():
        raise ConfigError(f"{src}: fleet.database: empty")
    p = Path(os.path.expanduser(value))
    return f"sqlite:///{(p if p.is_absolute() else base / p).absolute()}"


def default_path() -> Path:
    return Path(os.environ.get("FLEET_CONFIG", "fleet.toml"))


def read_toml(path: Path, missing: str, error: type[UsageError] = ConfigError) -> dict[str, Any]:
    """The TOML document at `path`; each way it can fail is one `error` line naming the file
    (`missing` says what to do when there is no such file)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid TOML: {e}") from None


def load(path: Path | None = None) -> Config:
    path = path or default_path()
    data = read_toml(path, "no such file (set FLEET_CONFIG or pass --config)")
    return parse(data, path.resolve())
