"""status.json (every tick) and the `RESULT standing` line (every result_every_s).

The schema is a contract with the pyinfra facts (`agent.contract.StatusFile`, built here
typed); docs/agent.md documents every field. Keep
additions backwards compatible and bump SCHEMA on a breaking change. The readings it is built
from have passed the freshness rule (freshness.py): a stale one has no figures and
`healthy: null`, so neither shows a frozen value as a current one.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Protocol, cast

from agent import __version__
from agent.base.config import Config
from agent.base.gpu import Admission
from agent.base.journal import utc
from agent.base.persist import AgentState
from agent.base.ports import P2PMapping
from agent.contract import (
    MINER,
    NODE,
    PROVER,
    AdmissionDoc,
    AgentRunState,
    DigestsDoc,
    Layout,
    ObserverDoc,
    P2PDoc,
    PeerDoc,
    ProgramDoc,
    ProgramState,
    RpcDoc,
    StatusFile,
    SwitchRecord,
    WritesDoc,
)
from agent.daemon.probes import Reading
from agent.daemon.program import Program

SCHEMA = 1
MAX_TEXT = 64  # a reported string longer than this is cut (status.json and the RESULT line)
MAX_VALUE = 256  # any one RESULT value (the agent's own reasons included)
LARGEST_COUNT = 2**63
MAX_PEER_LIST = 64  # entries of the node's peer_list kept (the node sends at most this many)
# what each reported figure must be; anything else (a 1 MB string, 2**70, "yes") is unknown
COUNT, FLAG, TEXT, RATE, PEERS = "count", "flag", "text", "rate", "peers"
NODE_FIELDS = {"version": TEXT, "blocks": COUNT, "daa_score": COUNT, "peers": COUNT,
               "peers_in": COUNT, "peers_out": COUNT, "synced": FLAG, "exec_tip": COUNT,
               "seed": TEXT, "peer_list": PEERS}
PEER_DIRS = ("in", "out")
# HOST:PORT: a hostname or IPv4 address, or an IPv6 address in brackets; the port 1-65535
_ENDPOINT = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
                       r":([1-9][0-9]{0,4})")


class Source(Protocol):
    """What the status is built from (the supervisor, seen through what it reports)."""

    cfg: Config
    layout: Layout
    state: AgentState
    mode: str | None
    admission: Admission
    p2p: P2PMapping
    started_at: float
    started_mono: float
    ticks: int

    @property
    def programs(self) -> Mapping[str, Program]: ...

    def readings(self) -> dict[str, Reading]: ...
    def pointer_view(self) -> dict[str, Any]: ...
    def recovery_view(self, now: float) -> dict[str, Any]: ...
    def pack_view(self) -> dict[str, Any]: ...
    def observer_view(self) -> dict[str, Any]: ...
    def digests_view(self) -> dict[str, Any]: ...
    def storage_view(self) -> dict[str, Any]: ...


def iso(ts: Any) -> str | None:
    """A time as UTC text; None for anything that is not a plausible time."""
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        return None
    return utc(ts) if 0 <= ts <= 1e11 else None


def _isos(view: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: iso(v) if k in keys else v for k, v in view.items()}


def build(src: Source, final: bool = False) -> StatusFile:
    now = time.time()
    readings = src.readings()
    if final:
        agent_state = AgentRunState.STOPPED if src.mode == "stop" else AgentRunState.EXITED
    else:
        agent_state = AgentRunState.STOPPING if src.mode == "stop" else AgentRunState.RUNNING
    node_reading = readings.get(NODE)
    miner_reading = readings.get(MINER)
    prover_reading = readings.get(PROVER)
    binary = src.state.node_binary
    admission = cast(AdmissionDoc, src.admission.as_dict())
    admission["checked_at"] = iso(admission["checked_at"])
    pack = src.pack_view()
    if pack.get("last_error"):
        pack["last_error"] = _isos(pack["last_error"], "at")
    # the views are the supervisor's plain dicts: their shapes are the contract's documents
    return {
        "schema": SCHEMA,
        "ts": utc(now),
        "agent": {
            "pid": os.getpid(),
            "version": __version__,
            "state": agent_state,
            "started_at": utc(src.started_at),
            "uptime_s": round(time.monotonic() - src.started_mono, 1),
            "ticks": src.ticks,
            "tick_s": src.cfg.tick_s,
            "root": str(src.layout.root),
            "config": str(src.cfg.path),
        },
        "observer": cast(ObserverDoc, _isos(src.observer_view(), "round_at")),
        "digests": cast(DigestsDoc, src.digests_view()),
        "storage": cast(WritesDoc, _isos(src.storage_view(), "since")),
        "admission": admission,
        "p2p": cast(P2PDoc, src.p2p.as_dict()),
        "node": {
            "binary": binary.path if binary else None,
            "sha256": binary.sha256 if binary else None,
            "sha16": binary.sha16 if binary else None,
            "source": binary.source if binary else None,
            "pointer": src.pointer_view(),
            "rpc": _pick(node_reading.data, NODE_FIELDS) if node_reading else None,
            "rpc_error": node_reading.error if node_reading else None,
            "rpc_at": iso(node_reading.at) if node_reading else None,
            "switch": cast(SwitchRecord, _isos(dict(src.state.switch), "applied_at",
                                               "old_exit_at", "new_started_at", "synced_at"))
            if src.state.switch else None,
        },
        "miner": {
            "hashrate": _get(miner_reading, "hashrate", RATE),
            "seed": _get(miner_reading, "seed", TEXT),
            "status_error": miner_reading.error if miner_reading else None,
            "pack": pack,
        },
        "prover": {
            "state": _get(prover_reading, "state", TEXT),
            "status_error": prover_reading.error if prover_reading else None,
        },
        "recovery": _isos(src.recovery_view(now), "last_started_at", "last_finished_at",
                          "cooldown_until"),
        "programs": {name: _program(p, readings.get(name), now)
                     for name, p in src.programs.items()},
        "standing": {"last_result_at": iso(src.state.last_result_at),
                     "every_s": src.cfg.result_every_s},
    }


def _program(p: Program, reading: Reading | None, now: float) -> ProgramDoc:
    proc = p.proc
    next_in = None
    if p.state == ProgramState.BACKOFF and p.next_start is not None:
        next_in = round(max(0.0, p.next_start - time.monotonic()), 3)
    last_exit = None
    if p.last_exit:
        last_exit = dict(p.last_exit, at=iso(p.last_exit.get("at")))
    return {
        "state": p.state,
        "pid": proc.pid if proc else None,
        "pgid": proc.pgid if proc else None,
        "adopted": proc.adopted if proc else None,
        "argv": proc.argv if proc else None,
        "binary": proc.binary if proc else None,
        "sha16": proc.sha256[:16] if proc and proc.sha256 else None,
        "started_at": iso(proc.started_at) if proc else None,
        "uptime_s": round(time.monotonic() - proc.started_mono, 1) if proc else None,
        "starts": p.starts,
        "failures": p.failures,
        "degraded": p.degraded,
        "next_start_in_s": next_in,
        "reason": p.reason,
        "last_exit": last_exit,
        "needs_gpu": p.cfg.needs_gpu,
        "healthy": reading.healthy if reading else None,
        "health_error": reading.error if reading else None,
        # the time of the reading `healthy` is judged by: old means the observer is stuck
        "reading_at": iso(reading.at) if reading and (reading.healthy is not None
                                                       or reading.stale) else None,
    }


def _pick(data: dict[str, Any] | None, kinds: dict[str, str]) -> RpcDoc | None:
    if data is None:
        return None
    return cast(RpcDoc, {k: _typed(data.get(k), kind) for k, kind in kinds.items()})


def _get(reading: Any, key: str, kind: str) -> Any:
    return _typed(reading.data.get(key), kind) if reading is not None and reading.data else None


def _typed(value: Any, kind: str) -> Any:
    """The value if it is what the field holds (a string cut to MAX_TEXT), else None."""
    if kind == PEERS:
        return _peer_list(value)
    if kind == FLAG:
        return value if isinstance(value, bool) else None
    if kind == TEXT:
        return value[:MAX_TEXT] if isinstance(value, str) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if kind == COUNT:
        return value if isinstance(value, int) and 0 <= value < LARGEST_COUNT else None
    return value if math.isfinite(value) and 0 <= value < LARGEST_COUNT else None


def _peer_list(value: Any) -> list[PeerDoc] | None:
    """The node's peer list, or None when it is not a list (unknown, never "no peers"). Only
    the first MAX_PEER_LIST entries are looked at (bounded work whatever the node sends); each
    kept entry is exactly {dir, remote, public}, and one with any of them wrong is dropped."""
    if not isinstance(value, list):
        return None
    kept = []
    for entry in value[:MAX_PEER_LIST]:
        peer = _peer(entry)
        if peer is not None:
            kept.append(peer)
    return kept


def _peer(entry: Any) -> PeerDoc | None:
    """One peer_list entry, or None. A remote longer than MAX_TEXT is dropped rather than cut:
    a cut HOST:PORT would name some other endpoint."""
    if not isinstance(entry, dict):
        return None
    direction, remote, public = entry.get("dir"), entry.get("remote"), entry.get("public")
    if not isinstance(direction, str) or direction not in PEER_DIRS:
        return None
    if not isinstance(public, bool) or not _is_endpoint(remote):
        return None
    return {"dir": direction, "remote": cast(str, remote), "public": public}


def _is_endpoint(value: Any) -> bool:
    """Whether value is a short HOST:PORT text with a port from 1 to 65535."""
    if not isinstance(value, str) or len(value) > MAX_TEXT or not value.isascii():
        return False
    match = _ENDPOINT.fullmatch(value)
    return match is not None and int(match.group(1)) <= 65535


def result_line(s: StatusFile) -> str:
    """`RESULT standing key=value ...`: values never hold whitespace or quotes (spaces in the
    admission reason become `_`), so `line.split()` parses it; unknown values are `-`."""
    node: ProgramDoc | dict[str, Any] = s["programs"].get(NODE) or {}
    rpc: RpcDoc | dict[str, Any] = s["node"].get("rpc") or {}
    adm = s["admission"]
    p2p = s["p2p"]
    node_uptime = node.get("uptime_s")
    fields: list[tuple[str, Any]] = [
        ("ts", s["ts"]),
        ("uptime_s", round(s["agent"]["uptime_s"])),
        ("node_pid", node.get("pid")),
        ("node_bin", s["node"].get("sha16")),
        ("node_uptime_s", None if node_uptime is None else round(node_uptime)),
        ("blocks", rpc.get("blocks")),
        ("daa_score", rpc.get("daa_score")),
        ("peers", rpc.get("peers")),
        ("peers_in", rpc.get("peers_in")),
        ("peers_out", rpc.get("peers_out")),
        ("synced", rpc.get("synced")),
        ("exec_tip", rpc.get("exec_tip")),
        ("miner_rate", s["miner"].get("hashrate")),
        ("prover", s["prover"].get("state")),
        ("admission", "ok" if adm["admitted"] else "refused"),
        ("p2p", f"{p2p['public_ip']}:{p2p['public_port']}" if p2p["mapped"] else "none"),
    ]
    if not adm["admitted"]:
        fields.append(("admission_reason", adm["reason"]))
    degraded = [name for name, p in s["programs"].items() if p.get("degraded")]
    if degraded:
        fields.append(("degraded", ",".join(degraded)))
    if not (s.get("storage") or {}).get("ok", True):  # run/ cannot be written (disk full?)
        fields.append(("storage", "failing"))
    return "RESULT standing " + " ".join(f"{k}={_value(v)}" for k, v in fields)


def _value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    text = "_".join(str(v).split()) or "-"
    return text.replace('"', "").replace("'", "")[:MAX_VALUE] or "-"  # a backstop: see _typed
