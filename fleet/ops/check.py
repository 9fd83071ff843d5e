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
from typing import TYPE_CHECKING, Any

from agent.contract import MINER, NODE, PROVER, ROOT
from facts.agent_json import STATUS
from fleet.boxes import boxssh
from fleet.core.config import host_network
from fleet.core.errors import ConfigError
from fleet.core.times import now_iso, seconds_between
from fleet.core.verdicts import Health
from fleet.ops import ports
from fleet.state import check_history, releases

if TYPE_CHECKING:
    from fleet.boxes.inventory import Built
    from fleet.core.config import Config

STALE_TICKS = 3  # a status or reading older than this many agent ticks tells nothing


def judge(label: str, data: dict[str, Any], status: dict[str, Any] | None,
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
    disk = status.get("disk") or {}
    h.disk_free, h.disk_total = _fullest(disk)
    if disk.get("full"):
        free = disk.get("free_bytes") or {}
        h.problems.append("disk full: " + ", ".join(
            f"{k}/ has {v} bytes free" for k, v in sorted(free.items()) if v is not None))
    h.agent = bool(status.get("alive"))
    if not h.agent:
        h.problems.append(f"agent: not alive (heartbeat {status.get('heartbeat_age_s')}s old)")
    limit = STALE_TICKS * float((status.get("agent") or {}).get("tick_s") or 15.0)
    status_age = status.get("status_age_s")
    if not isinstance(status_age, int | float) or status_age > limit:
        h.problems.append(f"agent: status not written for {status_age} s")
    storage = status.get("storage") or {}
    if storage.get("ok") is False:
        h.problems.append(f"agent: {storage.get('error')}")
    observer = status.get("observer") or {}
    if observer.get("alive") is not True:
        h.problems.append(f"agent: observer not running ({observer.get('last_error')})")
    node = status.get("node") or {}
    rpc = node.get("rpc") or {}
    reading_age = _age(status.get("ts"), node.get("rpc_at"), status_age)
    fresh = reading_age is not None and reading_age <= limit
    if rpc and not fresh:  # a frozen reading: neither synced nor moving can be told
        h.problems.append(f"node: reading is {reading_age} s old (unknown)")
        rpc = {}
    h.synced, h.blocks, h.exec_tip = rpc.get("synced"), rpc.get("blocks"), rpc.get("exec_tip")
    h.peers_in, h.peers_out = _count(rpc.get("peers_in")), _count(rpc.get("peers_out"))
    h.peer_list = [p for p in rpc.get("peer_list") or [] if isinstance(p, dict)][:64]
    h.node_sha16 = node.get("sha16")
    prog = (status.get("programs") or {}).get(NODE) or {}
    if prog.get("state") != "running":
        why = f"{prog.get('state') or 'absent'} {prog.get('reason') or ''}".strip()
        h.problems.append(f"node: {why}")
    if not h.synced:
        h.problems.append("node: not synced" if rpc else f"node: no RPC ({node.get('rpc_error')})")
    if h.exec_tip is not None:
        h.exec_moving = _moving(h.exec_tip, node.get("rpc_at"), previous)
        if not h.exec_moving:
            h.problems.append(f"node: exec tip stuck at {h.exec_tip}")
    if wanted and h.node_sha16 != wanted:
        h.problems.append(_wrong_node(h.node_sha16, wanted, known))
    adm = status.get("admission") or {}
    h.admitted, h.admission_reason = adm.get("admitted"), adm.get("reason")
    if not h.admitted and _carries(data, "gpu_programs", None):
        h.problems.append(f"admission refused: {h.admission_reason}")
    h.prover = (status.get("prover") or {}).get("state")
    if h.prover != "proving" and _carries(data, "programs", PROVER):
        h.problems.append(f"prover: {h.prover or 'absent'}")
    miner = (status.get("programs") or {}).get(MINER) or {}
    if miner.get("state") != "running" and _carries(data, "programs", MINER):
        # a miner box is well only with its miner up: crash-looping below the degraded
        # count, stopped, or never started is not (a refused admission is said above too)
        why = f"{miner.get('state') or 'absent'} {miner.get('reason') or ''}".strip()
        h.problems.append(f"miner: {why}")
    for name, p in (status.get("programs") or {}).items():
        if p.get("degraded"):
            h.problems.append(f"{name}: degraded ({p.get('reason')})")
    return h


def _carries(data: dict[str, Any], key: str, program: str | None) -> bool:
    """Whether the box's role carries the duty: `program` among its host data's `key` list
    (None: any program in it). Host data that does not say is judged on every duty."""
    named = data.get(key)
    if not isinstance(named, list):
        return True
    return bool(named) if program is None else program in named


def _fullest(disk: dict[str, Any]) -> tuple[int | None, int | None]:
    """(free, total) bytes of the fullest disk the agent writes to; (None, None) unknown."""
    free, total = disk.get("free_bytes") or {}, disk.get("total_bytes") or {}
    known = [(f, total.get(k)) for k, f in free.items() if _count(f) is not None
             and _count(total.get(k))]
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
    return f"node: runs {running}, wanted {wanted}"


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


def check(cfg: Config, built: Built) -> list[Health]:
    hosts = built.groups.get("standing", [])
    # standing boxes the provider no longer runs are the least well of all
    down = [Health(row.label, row.provider, problems=[f"provider: box is {status}"])
            for row, status in built.down if row.kind == "standing"]
    if not hosts:
        return down
    try:
        known = releases.load_or_empty(cfg.releases)
    except ConfigError:
        known = []
    history = check_history.load(cfg.registry)
    remembered: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=32) as pool:
        reads = list(pool.map(
            lambda h: boxssh.read_fact(h[1], STATUS, ROOT, STATUS_DEADLINE_S), hosts))
    by_name: dict[str, Any] = {}
    late: set[str] = set()
    unreadable: dict[str, str] = {}
    silent: dict[str, str] = {}  # SSH did not answer, and why
    hung: set[str] = set()  # ... though ssh connected: the command never ran
    for (name, _data), read in zip(hosts, reads, strict=True):
        if read.late:  # SSH answered and the command started: slow, not a death
            late.add(name)
        elif read.answered and read.value is None:  # SSH answered, the status did not
            unreadable[name] = read.error or "no status"
            by_name[name] = {}
        else:
            by_name[name] = read.value  # None: SSH did not answer
            if not read.answered and read.error:
                silent[name] = read.error
            if read.connected:
                hung.add(name)
    out = []
    network_size = Counter(host_network(data) for _, data in hosts)
    now = now_iso()
    for name, data in hosts:
        status = by_name.get(name) if name in by_name else None
        h = judge(name, data, status, _wanted(data, known), history.get(name), known)
        since = data.get("standing_since")
        h.star_only = star_only(h, network_size[host_network(data)] - 1,
                                seconds_between(since, now) if since else None,
                                cfg.loop.interval_s)
        if name in silent:
            h.problems = [f"ssh: {silent[name][:200]}"]
            h.hung = name in hung
        if name in unreadable:  # its agent is converged again, like a missing one
            h.problems = [f"agent: status unreadable ({unreadable[name][:200]})"]
        if name in late:  # SSH answered: not a death, and no deploy on a box this slow
            h.ssh = h.agent = True
            h.problems = [f"ssh: the status command did not finish within "
                          f"{STATUS_DEADLINE_S:g} s"]
        if h.exec_tip is not None and status:
            remembered[name] = {"exec_tip": h.exec_tip, "moving": h.exec_moving,
                             "rpc_at": (status.get("node") or {}).get("rpc_at"),
                             "at": time.time()}
        out.append(h)
    ports.judge(hosts, out, cfg.loop.interval_s)
    check_history.save(cfg.registry, remembered)
    return out + down
