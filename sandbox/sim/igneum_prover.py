#!/usr/bin/env python3
"""igneum-prover: the sandbox's stand-in for the prover (stdlib only, one file).

Usage:
  igneum-prover --node-rpc URL --status-file FILE
  igneum-prover --version

Every second it reads URL/status and writes FILE as JSON {"state", "proofs", "ts"}:
`waiting_for_node` while the node is unreachable or not synced, `idle` while the node is synced
but its exec tip reads 0 (nothing to prove), `proving` otherwise; each new exec tip seen while
proving counts one proof (per process). SIGTERM exits 0.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

VERSION = "dev"  # stamped by sandbox.releases

STOP = threading.Event()


def log(msg: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{stamp} igneum-prover {msg}", flush=True)


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def node_status(rpc: str) -> dict[str, Any] | None:
    url = rpc if rpc.rstrip("/").endswith("/status") else rpc.rstrip("/") + "/status"
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            status = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="igneum-prover", description="Igneum prover (sandbox simulator)"
    )
    p.add_argument("--version", action="version", version=f"igneum-prover {VERSION}")
    p.add_argument("--node-rpc", required=True, help="the node's RPC base URL")
    p.add_argument("--status-file", required=True, type=Path)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    signal.signal(signal.SIGINT, lambda *_: STOP.set())
    log(f"{VERSION} up: node {args.node_rpc}")
    proofs, last_tip, last_state = 0, 0, ""
    while not STOP.is_set():
        node = node_status(args.node_rpc)
        tip = node.get("exec_tip", 0) if node else 0
        if not node or not node.get("synced"):
            state = "waiting_for_node"
        elif not isinstance(tip, int) or tip <= 0:
            state = "idle"
        else:
            state = "proving"
            if tip > last_tip:
                proofs += 1
                last_tip = tip
        if state != last_state:
            log(state)
            last_state = state
        write_json_atomic(args.status_file, {"state": state, "proofs": proofs, "ts": time.time()})
        STOP.wait(1.0)
    log("SIGTERM: stopping")
    return 0


if __name__ == "__main__":
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    sys.exit(main(sys.argv[1:]))
