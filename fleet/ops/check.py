"""`fleet check`: is every standing box well?

One SSH command per box (the agent's own `status`, the `AgentStatus` fact's command and
parser, run through the system's `ssh` like every other read of the operator's: as
`facts.agent_json.STATUS`, the same fact without pyinfra, which a tick so never loads), so the
operator reads exactly what the box reads. The boxes are read in parallel. A box is well when
SSH answers, the agent is alive, the node runs the wanted binary and is synced with its exec
tip moving, the prover proves and the GPU programs are admitted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from agent.contract import MINER, NODE, PROVER, ROOT, DiskDoc, ProgramState, RpcDoc, StatusDoc
from facts.agent_json import STATUS
from fleet.boxes import boxssh
from fleet.core.config import host_network
from fleet.core.errors import ConfigError
from fleet.core.states import BoxKind
from fleet.core.times import now_iso, seconds_between
from fleet.core.verdicts import Health
from fleet.core.verdicts import known as told  # `known` names the releases below
from fleet.ops import ports
from fleet.state import check_history, releases

if TYPE_CHECKING:
    from fleet.boxes.inventory import Built
    from fleet.core.config import Config

STALE_TICKS = 3  # a status or reading older than this many agent ticks tells nothing


def judge(label: str, data: dict[str, Any], status: StatusDoc | None,
          wanted: str | None, previous: dict[str, Any] | None,
          known: Sequence[releases.Release] = ()) -> Health:
    """Turn one box's agent status into a verdict with its reasons. What cannot be told (an
    old status, an old reading, a dead observer) is a problem, never the last good verdict.
    With the release store's releases (`known`), a box on an older release than the wanted
    one (the last publish's) is named *behind*."""
    h = Health(label, str(data.get("provider")), wanted_sha16=wanted)
    if status is None:
        h.problems.append("ssh: box did not answer")
        return h
    h.ssh = True
    if not status:
        h.problems.append("agent: not installed")
        return h
    agent = status.get("agent")
    limit = STALE_TICKS * float((agent.get("tick_s") if agent else None) or 15.0)
    _judge_agent(h, status, limit)
    _judge_node(h, status, limit, previous, known)
    _judge_duties(h, data, status)
    return h


def _judge_agent(h: Health, status: StatusDoc, limit: float) -> None:
    """The agent itself: its disk, its heartbeat, its status's age, its writes, its observer."""
    disk = status.get("disk")
    h.disk_free, h.disk_total = _fullest(disk)
    if disk and disk.get("full"):
        free = disk.get("free_bytes") or {}
        h.problems.append("disk full: " + ", ".join(
            f"{k}/ has {v} bytes free" for k, v in sorted(free.items()) if v is not None))
    h.agent = bool(status.get("alive"))
    if not h.agent:
        h.problems.append(f"agent: not alive (heartbeat {told(status.get('heartbeat_age_s'))}s "
                          "old)")
    status_age = status.get("status_age_s")
    if not isinstance(status_age, int | float) or status_age > limit:
        h.problems.append(f"agent: status not written for {told(status_age)} s")
    storage = status.get("storage")
    if storage and storage.get("ok") is False:
        h.problems.append(f"agent: {told(storage.get('error'))}")
    observer = status.get("observer")
    if not observer or observer.get("alive") is not True:
        h.problems.append("agent: observer not running "
                          f"({told(observer.get('last_error') if observer else None)})")


def _fresh_rpc(h: Health, status: StatusDoc, limit: float) -> RpcDoc | None:
    """The node's RPC reading, None when there is none or it is too old to tell anything
    (a frozen reading: neither synced nor moving can be told, which is a problem)."""
    node = status.get("node")
    rpc = node.get("rpc") if node else None
    reading_age = _age(status.get("ts"), node.get("rpc_at") if node else None,
                       status.get("status_age_s"))
    fresh = reading_age is not None and reading_age <= limit
    if rpc and not fresh:
        h.problems.append(f"node: reading is {told(reading_age)} s old (unknown)")
        return None
    return rpc or None


def _judge_node(h: Health, status: StatusDoc, limit: float, previous: dict[str, Any] | None,
                known: Sequence[releases.Release]) -> None:
    """The node: its program, its sync and exec tip (from a fresh reading), its binary."""
    node = status.get("node")
    rpc = _fresh_rpc(h, status, limit)
    if rpc:
        h.synced, h.blocks, h.exec_tip = rpc.get("synced"), rpc.get("blocks"), \
            rpc.get("exec_tip")
        h.peers_in, h.peers_out = _count(rpc.get("peers_in")), _count(rpc.get("peers_out"))
        h.peer_list = cast(list[dict[str, Any]], [
            p for p in rpc.get("peer_list") or [] if isinstance(p, dict)][:64])
    h.node_sha16 = node.get("sha16") if node else None
    _judge_program(h, status, NODE)
    if not h.synced:
        h.problems.append("node: not synced" if rpc else
                          f"node: no RPC ({told(node.get('rpc_error') if node else None)})")
    if h.exec_tip is not None:
        h.exec_moving = _moving(h.exec_tip, node.get("rpc_at") if node else None, previous)
        if not h.exec_moving:
            h.problems.append(f"node: exec tip stuck at {h.exec_tip}")
    if h.wanted_sha16 and h.node_sha16 != h.wanted_sha16:
        h.problems.append(_wrong_node(h.node_sha16, h.wanted_sha16, known))


def _judge_program(h: Health, status: StatusDoc, name: str) -> None:
    """A program the box must run (the node; the miner where its role carries one)."""
    prog = (status.get("programs") or {}).get(name)
    if not prog or prog.get("state") != ProgramState.RUNNING:
        state = prog.get("state") if prog else None
        reason = prog.get("reason") if prog else None
        h.problems.append(f"{name}: " + f"{state or 'absent'} {reason or ''}".strip())


def _judge_duties(h: Health, data: dict[str, Any], status: StatusDoc) -> None:
    """What the box's role asks of it: admitted GPUs, a proving prover, a running miner, and
    no program crash-looping."""
    adm = status.get("admission")
    h.admitted = adm.get("admitted") if adm else None
    h.admission_reason = adm.get("reason") if adm else None
    if not h.admitted and _carries(data, "gpu_programs", None):
        # unknown (no admission in the status) is not well either, but it is no refusal
        h.problems.append("admission: unknown" if h.admitted is None else
                          f"admission refused: {h.admission_reason}")
    prover = status.get("prover")
    h.prover = prover.get("state") if prover else None
    if h.prover != "proving" and _carries(data, "programs", PROVER):
        h.problems.append(f"prover: {h.prover or 'absent'}")
    if _carries(data, "programs", MINER):
        # a miner box is well only with its miner up: crash-looping below the degraded
        # count, stopped, or never started is not (a refused admission is said above too)
        _judge_program(h, status, MINER)
    for name, p in (status.get("programs") or {}).items():
        if p.get("degraded"):
            h.problems.append(f"{name}: degraded ({told(p.get('reason'))})")


def _carries(data: dict[str, Any], key: str, program: str | None) -> bool:
    """Whether the box's role carries the duty: `program` among its host data's `key` list
    (None: any program in it). Host data that does not say is judged on every duty."""
    named = data.get(key)
    if not isinstance(named, list):
        return True
    return bool(named) if program is None else program in named


def _fullest(disk: DiskDoc | None) -> tuple[int | None, int | None]:
    """(free, total) bytes of the fullest disk the agent writes to; (None, None) unknown."""
    if not disk:
        return None, None
    free, total = disk.get("free_bytes") or {}, disk.get("total_bytes") or {}
    counted = [(_count(f), _count(total.get(k))) for k, f in free.items()]
    known = [(f, t) for f, t in counted if f is not None and t]
    return min(known, key=lambda ft: ft[0] / ft[1]) if known else (None, None)


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


MESH_IN = 2  # inbound peers a node of a mesh needs (fewer where its network has fewer boxes)


def star_only(h: Health, mates: int, standing_s: float | None, interval_s: float) -> bool | None:
    """Whether `h`'s node is dialled by fewer of its network's `mates` (the other standing
    boxes of the network, whatever their role) than the mesh needs, min(MESH_IN, mates): it
    only dials out, like the spoke of a star. Told once the box has been standing one loop
    interval; None while it cannot be (no fresh reading, too early, or a network of one box)."""
    if h.peers_in is None or mates == 0 or standing_s is None or standing_s < interval_s:
        return None
    return h.peers_in < min(MESH_IN, mates)


def _wrong_node(running: str | None, wanted: str, known: Sequence[releases.Release]) -> str:
    have = releases.by_node_sha256(known, running)
    want = releases.by_node_sha256(known, wanted)
    if have is not None and want is not None:
        where = "behind" if have.key < want.key else "ahead"
        return (f"node: {where}: runs {have.version} ({running}), wanted {want.version} "
                f"({wanted})")
    return f"node: runs {told(running)}, wanted {wanted}"


def _age(status_ts: Any, read_at: Any, status_age: Any) -> float | None:
    """Seconds since a reading was taken, on the box's own clock: from the reading to the
    status that carries it, plus the status's age. None when either time is unknown."""
    gap = seconds_between(read_at, status_ts)
    if gap is None or not isinstance(status_age, int | float):
        return None
    return round(max(0.0, gap) + status_age, 1)


def _moving(tip: int, read_at: str | None, previous: dict[str, Any] | None) -> bool:
    """Is the exec tip moving? Judged against the last *different* reading of the node: the
    agent probes it every tick, so two checks within one tick see the same (fresh) reading."""
    if tip <= 0:
        return False
    if not previous or previous.get("exec_tip") is None:
        return True  # first look: a tip above 0 that follows the blocks
    if read_at is not None and previous.get("rpc_at") == read_at:
        return bool(previous.get("moving", True))
    return tip > int(previous["exec_tip"])


def _wanted(data: dict[str, Any], known: Sequence[releases.Release]) -> str | None:
    """The node a box is wanted on: its own, else its role's release (by version or node
    sha16) in the store's releases `known`, read once a check; None when neither is told."""
    if data.get("node_sha16_wanted"):
        return str(data["node_sha16_wanted"])
    version = data.get("release")
    if not version:
        return None
    return next((r.node_sha16 for r in known
                 if r.version == str(version) or r.node_sha16 == str(version)), None)


STATUS_DEADLINE_S = 30.0  # one box's status command; connecting is bounded by its own timeouts


@dataclass
class _Reads:
    """The status reads of a check, sorted by what became of each."""

    by_name: dict[str, StatusDoc | None] = field(default_factory=dict)
    late: set[str] = field(default_factory=set)
    unreadable: dict[str, str] = field(default_factory=dict)
    silent: dict[str, str] = field(default_factory=dict)  # SSH did not answer, and why
    hung: set[str] = field(default_factory=set)  # ... though ssh connected: the command never ran

    @classmethod
    def of(cls, hosts: Sequence[tuple[str, Any]], reads: Sequence[boxssh.FactRead]) -> _Reads:
        out = cls()
        for (name, _data), read in zip(hosts, reads, strict=True):
            if read.late:  # SSH answered and the command started: slow, not a death
                out.late.add(name)
            elif read.answered and read.value is None:  # SSH answered, the status did not
                out.unreadable[name] = read.error or "no status"
                out.by_name[name] = cast(StatusDoc, {})  # judged as no agent
            else:
                out.by_name[name] = read.value  # None: SSH did not answer
                if not read.answered and read.error:
                    out.silent[name] = read.error
                if read.connected:
                    out.hung.add(name)
        return out

    def overrule(self, h: Health) -> None:
        """What the read itself says of the box, over what its status said."""
        name = h.label
        if name in self.silent:
            h.problems = [f"ssh: {self.silent[name][:200]}"]
            h.hung = name in self.hung
        if name in self.unreadable:  # its agent is converged again, like a missing one
            h.problems = [f"agent: status unreadable ({self.unreadable[name][:200]})"]
        if name in self.late:  # SSH answered: not a death, and no deploy on a box this slow
            h.ssh = h.agent = True
            h.problems = [f"ssh: the status command did not finish within "
                          f"{STATUS_DEADLINE_S:g} s"]


def check(cfg: Config, built: Built) -> list[Health]:
    hosts = built.groups.get("standing", [])
    # standing boxes the provider no longer runs are the least well of all
    down = [Health(row.label, row.provider, problems=[f"provider: box is {status}"])
            for row, status in built.down if row.kind == BoxKind.STANDING]
    if not hosts:
        return down
    try:
        known = releases.load_or_empty(cfg.releases)
    except ConfigError:
        known = []
    history = check_history.load(cfg.registry)
    remembered: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=32) as pool:
        reads = _Reads.of(hosts, list(pool.map(
            lambda h: boxssh.read_fact(h[1], STATUS, ROOT, STATUS_DEADLINE_S), hosts)))
    out = []
    network_size = Counter(host_network(data) for _, data in hosts)
    now = now_iso()
    for name, data in hosts:
        status = reads.by_name.get(name)
        h = judge(name, data, status, _wanted(data, known), history.get(name), known)
        since = data.get("standing_since")
        h.star_only = star_only(h, network_size[host_network(data)] - 1,
                                seconds_between(since, now) if since else None,
                                cfg.loop.interval_s)
        reads.overrule(h)
        if h.exec_tip is not None and status:
            node = status.get("node")
            remembered[name] = {"exec_tip": h.exec_tip, "moving": h.exec_moving,
                                "rpc_at": node.get("rpc_at") if node else None,
                                "at": time.time()}
        out.append(h)
    ports.judge(hosts, out, cfg.loop.interval_s)
    check_history.save(cfg.registry, remembered)
    return out + down
