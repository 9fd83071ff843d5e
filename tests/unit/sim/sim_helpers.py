"""Helpers for the simulator tests: processes that always die, free ports, polling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from loopback import free_port

from sandbox.releases import Release

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "in" / "box-exec-snapshot.sh"
DEADLINE_S = 20.0
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], deadline_s: float = DEADLINE_S) -> T:
    """Poll probe until it returns something truthy; fail naming `what` past the deadline."""
    end = time.monotonic() + deadline_s
    last: T | None = None
    while time.monotonic() < end:
        last = probe()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def get_status(rpc_port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{rpc_port}/status", timeout=2) as r:
            status: dict[str, Any] = json.loads(r.read())
            return status
    except OSError:
        return None


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


@dataclass
class Node:
    datadir: Path
    p2p_port: int
    rpc_port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def knobs(self) -> Path:
        return self.datadir / "knobs.json"

    @property
    def rpc(self) -> str:
        return f"http://127.0.0.1:{self.rpc_port}"

    def status(self) -> dict[str, Any] | None:
        return get_status(self.rpc_port)

    def wait(self, what: str, cond: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            s = self.status()
            return s if s is not None and cond(s) else None

        return wait_for(what, probe)


@dataclass
class Procs:
    """Starts the simulators; every process it started is killed at teardown."""

    release: Release
    tmp: Path
    started: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def start(self, name: str, *args: str, env: dict[str, str] | None = None,
              binary: Path | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp / f"{name}-{len(self.started)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(binary or self.release.file(name)), *args],
                                    stdout=out, stderr=subprocess.STDOUT, env=env)
        self.started.append((proc, log))
        return proc, log

    def node(self, knobs: dict[str, Any] | None, datadir: Path | None = None,
             *extra: str, p2p_port: int | None = None, rpc_port: int | None = None,
             binary: Path | None = None) -> Node:
        datadir = datadir or self.tmp / f"node{len(self.started)}"
        datadir.mkdir(parents=True, exist_ok=True)
        if knobs is not None:
            write_json(datadir / "knobs.json", knobs)
        p2p, rpc = p2p_port or free_port(), rpc_port or free_port()
        proc, log = self.start("igneumd", "--datadir", str(datadir), "--p2p-port", str(p2p),
                               "--rpc-port", str(rpc), *extra, binary=binary)
        node = Node(datadir, p2p, rpc, proc, log)
        wait_for(f"igneumd RPC on {rpc}", lambda: node.status() is not None or
                 proc.poll() is not None)
        assert proc.poll() is None, log.read_text()
        return node

    def close(self) -> None:
        for proc, _ in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)


def fast_knobs(**kw: Any) -> dict[str, Any]:
    """A chain that syncs past 1,000 blocks in about a second and then moves on slowly."""
    knobs: dict[str, Any] = {"start_height": 0, "network_height": 1200, "sync_blocks_per_s": 2000,
                             "blocks_per_s": 5, "seed_every": 100000}
    knobs.update(kw)
    return knobs
