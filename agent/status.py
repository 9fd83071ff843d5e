"""status.json (every tick) and the `RESULT standing` line (every result_every_s).

The schema is a contract with the pyinfra facts; docs/agent.md documents every field. Keep
additions backwards compatible and bump SCHEMA on a breaking change.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from agent import __version__
from agent.journal import utc

if TYPE_CHECKING:
    from agent.program import Program
    from agent.supervisor import Supervisor

SCHEMA = 1
NODE_FIELDS = ("version", "blocks", "daa_score", "peers", "synced", "exec_tip", "seed")


def iso(ts: Any) -> str | None:
    return utc(ts) if isinstance(ts, int | float) else None


def build(sup: Supervisor, final: bool = False) -> dict[str, Any]:
    now = time.time()
    readings = sup.observer.readings if sup.observer else {}
    if final:
        agent_state = "stopped" if sup.mode == "stop" else "exited"
    else:
        agent_state = "stopping" if sup.mode == "stop" else "running"
    node_reading = readings.get("node")
    miner_reading = readings.get("miner")
    prover_reading = readings.get("prover")
    binary = sup.state.node_binary
    rec = sup.state.recovery
    admission = sup.admission.as_dict()
    admission["checked_at"] = iso(admission["checked_at"])
    return {
        "schema": SCHEMA,
        "ts": utc(now),
        "agent": {
            "pid": os.getpid(),
            "version": __version__,
            "state": agent_state,
            "started_at": utc(sup.started_at),
            "uptime_s": round(now - sup.started_at, 1),
            "ticks": sup.ticks,
            "tick_s": sup.cfg.tick_s,
            "root": str(sup.layout.root),
            "config": str(sup.cfg.path),
        },
        "admission": admission,
        "p2p": sup.p2p.as_dict(),
        "node": {
            "binary": binary.path if binary else None,
            "sha256": binary.sha256 if binary else None,
            "sha16": binary.sha16 if binary else None,
            "source": binary.source if binary else None,
            "pointer": dict(sup.pointer_view),
            "rpc": _pick(node_reading.data, NODE_FIELDS) if node_reading else None,
            "rpc_error": node_reading.error if node_reading else None,
            "rpc_at": iso(node_reading.at) if node_reading else None,
        },
        "miner": {
            "hashrate": _get(miner_reading, "hashrate"),
            "seed": _get(miner_reading, "seed"),
            "status_error": miner_reading.error if miner_reading else None,
            "pack": {
                "seed": sup.state.pack_seed,
                "exporting": sup.pack_task_seed,
                "last_error": _pack_error(sup.pack_error),
            },
        },
        "prover": {
            "state": _get(prover_reading, "state"),
            "status_error": prover_reading.error if prover_reading else None,
        },
        "recovery": _recovery(sup, rec, now),
        "programs": {name: _program(p, sup, now) for name, p in sup.programs.items()},
        "standing": {"last_result_at": iso(sup.state.last_result_at),
                     "every_s": sup.cfg.result_every_s},
    }


def _program(p: Program, sup: Supervisor, now: float) -> dict[str, Any]:
    proc = p.proc
    readings = sup.observer.readings if sup.observer else {}
    reading = readings.get(p.name)
    next_in = None
    if p.state == "backoff" and p.next_start is not None:
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
        "uptime_s": round(now - proc.started_at, 1) if proc else None,
        "starts": p.starts,
        "failures": p.failures,
        "degraded": p.degraded,
        "next_start_in_s": next_in,
        "reason": p.reason,
        "last_exit": last_exit,
        "needs_gpu": p.cfg.needs_gpu,
        "healthy": reading.healthy if reading else None,
        "health_error": reading.error if reading else None,
    }


def _recovery(sup: Supervisor, rec: dict[str, Any], now: float) -> dict[str, Any]:
    cfg = sup.cfg.recovery
    finished = rec.get("finished_at")
    cooldown_until = None
    state = "running" if sup.recovery_task is not None else "idle"
    if state == "idle" and isinstance(finished, int | float) and now < finished + cfg.cooldown_s:
        state, cooldown_until = "cooldown", finished + cfg.cooldown_s
    return {
        "configured": bool(cfg.recipe),
        "state": state,
        "runs": rec.get("runs", 0),
        "last_started_at": iso(rec.get("started_at")),
        "last_finished_at": iso(finished),
        "last_rc": rec.get("rc"),
        "last_outcome": rec.get("outcome"),
        "cooldown_until": iso(cooldown_until),
    }


def _pack_error(err: dict[str, Any] | None) -> dict[str, Any] | None:
    if not err:
        return None
    return {"seed": err.get("seed"), "rc": err.get("rc"), "outcome": err.get("outcome"),
            "error": err.get("error"), "at": iso(err.get("at"))}


def _pick(data: dict[str, Any] | None, keys: tuple[str, ...]) -> dict[str, Any] | None:
    return None if data is None else {k: data.get(k) for k in keys}


def _get(reading: Any, key: str) -> Any:
    return reading.data.get(key) if reading is not None and reading.data else None


def result_line(s: dict[str, Any]) -> str:
    """`RESULT standing key=value ...`: values never hold whitespace or quotes (spaces in the
    admission reason become `_`), so `line.split()` parses it; unknown values are `-`."""
    node = s["programs"].get("node") or {}
    rpc = s["node"].get("rpc") or {}
    adm = s["admission"]
    p2p = s["p2p"]
    fields: list[tuple[str, Any]] = [
        ("ts", s["ts"]),
        ("uptime_s", round(s["agent"]["uptime_s"])),
        ("node_pid", node.get("pid")),
        ("node_bin", s["node"].get("sha16")),
        ("node_uptime_s", None if node.get("uptime_s") is None else round(node["uptime_s"])),
        ("blocks", rpc.get("blocks")),
        ("daa_score", rpc.get("daa_score")),
        ("peers", rpc.get("peers")),
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
    return "RESULT standing " + " ".join(f"{k}={_value(v)}" for k, v in fields)


def _value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    text = "_".join(str(v).split()) or "-"
    return text.replace('"', "").replace("'", "")
