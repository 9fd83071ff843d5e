#!/usr/bin/env python3
"""igneumd: the sandbox's stand-in for an Igneum node (stdlib only, one file).

Usage:
  igneumd --datadir DIR --p2p-port P [--p2p-public HOST:PORT] [--peers HOST:PORT,...]
          [--peers-file FILE] --rpc-port R [--knobs FILE]
  igneumd --version

It listens for peers on 0.0.0.0:P (line protocol: `HELLO <version> <blocks> [<public>]` both
ways, then `PING <blocks>` every 2 s; a peer silent for 10 s is dropped), dials the peers it is
given (retrying every second), and serves `GET http://127.0.0.1:R/status` as JSON, with every
live peer's direction and remote endpoint. The chain is simulated: the node syncs from its start
height toward the network height, then follows the network at `blocks_per_s`. Knobs (JSON,
re-read every second) steer it; see docs/sandbox.md. Height persists in DIR/state.json, so a
restart resumes. SIGTERM saves and exits 0.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

VERSION = "dev"  # stamped by sandbox.releases

DEFAULT_KNOBS: dict[str, Any] = {
    "exec_stuck": False,  # once synced, exec_tip reads 0 until an exec snapshot clears it
    "crash_after_s": None,  # exit 1 this many seconds after start
    "crash_now": False,  # exit 1 at once
    "blocks_per_s": 1.0,  # the network's block rate
    "sync_blocks_per_s": 400.0,  # how fast a node behind the network catches up
    "seed_every": 300,  # blocks per seed epoch
    "start_height": 0,  # height of a fresh datadir
    "network_height": 1200,  # the network's height at first start; raising it makes the node resync
    "never_sync_versions": [],  # versions (e.g. ["1.5.0"]) that stay one block behind, never synced
}
PING_EVERY_S = 2.0
PEER_SILENT_S = 10.0  # read at use time, so a test may shorten it
MAX_PEER_LIST = 64  # entries of `peer_list` in the status (the counts are never capped)
MAX_ENDPOINT = 64  # characters of an announced public HOST:PORT
MAX_COUNT_DIGITS = 20  # a reported height longer than this is not a height
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
STOP = threading.Event()


def log(msg: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{stamp} igneumd {msg}", flush=True)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def seed_for(blocks: int, seed_every: int) -> str:
    """The epoch seed: first 16 hex of sha256 of the epoch number in decimal."""
    return hashlib.sha256(str(blocks // max(1, seed_every)).encode()).hexdigest()[:16]


def parse_addr(text: str) -> tuple[str, int] | None:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def endpoint(host: str, port: int) -> str:
    """HOST:PORT as text, an IPv6 host in brackets so the port stays the last `:` field."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def public_endpoint(text: str) -> str | None:
    """The public HOST:PORT a peer announced, normalised; None for anything else, so a bad
    4th HELLO field is treated as absent (never stored, logged or echoed as received)."""
    if len(text) > MAX_ENDPOINT or not text.isascii():
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not _HOST.fullmatch(host) or not port.isdigit() or len(port) > 5:
        return None
    if not 1 <= int(port) <= 65535:
        return None
    return endpoint(host.strip("[]"), int(port))


def count_field(text: str) -> int | None:
    """A block count from the wire: plain ASCII digits of sane length (int() of a huge or
    non-ASCII digit string would raise or mean something else), else None."""
    if not text.isascii() or not text.isdigit() or len(text) > MAX_COUNT_DIGITS:
        return None
    return int(text)


class Knobs:
    """The knob file, re-read on demand; a bad file keeps the last good values."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict[str, Any] = dict(DEFAULT_KNOBS)
        self._complained = ""

    def reload(self) -> None:
        try:
            raw = json.loads(self.path.read_text())
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            self.values = dict(DEFAULT_KNOBS)
            return
        except (OSError, ValueError) as exc:
            if self._complained != str(exc):
                log(f"knobs: ignoring unreadable {self.path}: {exc}")
                self._complained = str(exc)
            return
        values = dict(DEFAULT_KNOBS)
        for key, default in DEFAULT_KNOBS.items():
            value = raw.get(key, default)
            if key == "crash_after_s":
                ok = value is None or isinstance(value, int | float)
            elif isinstance(default, list):
                ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            elif isinstance(default, bool):
                ok = isinstance(value, bool)
            else:
                ok = isinstance(value, int | float) and not isinstance(value, bool)
            if ok:
                values[key] = value
            elif self._complained != key:
                log(f"knobs: ignoring bad {key}={value!r}")
                self._complained = key
        self.values = values

    def clear_exec_stuck(self) -> None:
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if isinstance(raw, dict) and raw.get("exec_stuck"):
            raw["exec_stuck"] = False
            write_json_atomic(self.path, raw)
        self.values["exec_stuck"] = False


class Chain:
    """Simulated chain state: our height, the network's height, exec tip and seed."""

    def __init__(self, state_path: Path, knobs: dict[str, Any]) -> None:
        self.state_path = state_path
        self.lock = threading.Lock()
        self.ever_synced = False
        try:
            state = json.loads(state_path.read_text())
            self.height = float(state["height"])
            downtime = max(0.0, time.time() - float(state["saved_at"]))
            self.network = float(state["network"]) + downtime * float(knobs["blocks_per_s"])
            log(f"resuming at height {int(self.height)} (network ~{int(self.network)})")
        except (OSError, ValueError, KeyError, TypeError):
            self.height = float(knobs["start_height"])
            self.network = max(self.height, float(knobs["network_height"]))
            log(f"fresh datadir: start {int(self.height)}, network {int(self.network)}")
        self.synced = False

    def tick(self, dt: float, knobs: dict[str, Any], peer_best: int) -> None:
        with self.lock:
            rate = max(0.0, float(knobs["blocks_per_s"]))
            self.network += rate * dt
            self.network = max(self.network, float(knobs["network_height"]), float(peer_best))
            if self.height < self.network:
                catch_up = max(rate, float(knobs["sync_blocks_per_s"]))
                self.height = min(self.network, self.height + catch_up * dt)
            if VERSION in knobs["never_sync_versions"]:  # a release that cannot follow
                self.height = min(self.height, self.network - 1.0)
            was = self.synced
            self.synced = self.height >= self.network
            if self.synced and not was:
                log(f"synced at {int(self.height)}")
            elif was and not self.synced:
                log(f"behind the network ({int(self.height)} < {int(self.network)}): syncing")
            self.ever_synced = self.ever_synced or self.synced

    def status(self, knobs: dict[str, Any], peers: int) -> dict[str, Any]:
        with self.lock:
            blocks = int(self.height)
            stuck = bool(knobs["exec_stuck"]) and self.ever_synced
            return {
                "version": VERSION,
                "blocks": blocks,
                "daa_score": blocks + blocks // 4,
                "peers": peers,
                "synced": self.synced,
                "exec_tip": 0 if stuck else max(0, blocks - 2),
                "seed": seed_for(blocks, int(knobs["seed_every"])),
            }

    def save(self) -> None:
        with self.lock:
            state = {"height": int(self.height), "network": self.network, "saved_at": time.time()}
        write_json_atomic(self.state_path, state)


@dataclass
class Link:
    """One live, handshaked connection: which side dialed, and who is at the other end."""

    dir: str  # "in": accepted on our p2p port; "out": we dialed it
    remote: str  # HOST:PORT: the address dialed, the dialer's announced public, or its socket
    public: bool  # whether `remote` is an endpoint others can dial (false: a socket's source)
    blocks: int  # the peer's last reported height


class P2P:
    """Listens, dials, handshakes and keeps the live peers with their direction and endpoint."""

    def __init__(self, port: int, public: str | None, blocks: Callable[[], int],
                 stop: threading.Event = STOP) -> None:
        self.port = port
        self.public = public
        self.hello_public = public_endpoint(public) if public else None  # sent as HELLO's 4th
        self.blocks = blocks
        self.stop = stop  # the process's STOP; a test gives each instance its own
        self.lock = threading.Lock()
        self.live: dict[int, Link] = {}  # connection id -> the link
        self.wanted: set[str] = set()
        self.dialing: set[str] = set()
        self._ids = 0
        self.server = socket.create_server(("0.0.0.0", port), reuse_port=False)
        self.server.settimeout(1.0)  # accept wakes up to notice `stop`

    def count(self) -> int:
        with self.lock:
            return len(self.live)

    def best(self) -> int:
        with self.lock:
            return max((link.blocks for link in self.live.values()), default=0)

    def view(self) -> dict[str, Any]:
        """The status's peer fields, all from one snapshot: the counts cover every live peer,
        the list the first MAX_PEER_LIST in a stable order."""
        with self.lock:
            links = list(self.live.values())
        entries = sorted((link.dir, link.remote, link.public) for link in links)
        return {
            "peers": len(links),
            "peers_in": sum(1 for link in links if link.dir == "in"),
            "peers_out": sum(1 for link in links if link.dir == "out"),
            "peer_list": [{"dir": d, "remote": r, "public": p}
                          for d, r, p in entries[:MAX_PEER_LIST]],
        }

    def close(self) -> None:
        """Stop listening and dialing; live connections end within a second."""
        self.stop.set()
        self.server.close()

    def is_self(self, addr: str) -> bool:
        parsed = parse_addr(addr)
        if parsed is None or addr == self.public:
            return True
        host, port = parsed
        return port == self.port and host in ("127.0.0.1", "localhost", "0.0.0.0")

    def set_wanted(self, addrs: list[str]) -> None:
        wanted = {a for a in addrs if not self.is_self(a)}
        with self.lock:
            self.wanted = wanted
            new = wanted - self.dialing
            self.dialing |= new
        for addr in sorted(new):
            threading.Thread(target=self._dial_loop, args=(addr,), daemon=True).start()

    def accept_loop(self) -> None:
        while not self.stop.is_set():
            try:
                conn, (host, port, *_) = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            source = endpoint(str(host), int(port))
            threading.Thread(target=self._serve, args=(conn, None, source), daemon=True).start()

    def _dial_loop(self, addr: str) -> None:
        failed = False
        while not self.stop.is_set():
            with self.lock:
                if addr not in self.wanted:
                    self.dialing.discard(addr)
                    return
            host, port = parse_addr(addr) or ("", 0)
            try:
                conn = socket.create_connection((host, port), timeout=2.0)
            except OSError as exc:
                if not failed:
                    log(f"p2p: cannot reach {addr} yet ({exc}); retrying")
                failed = True
            else:
                failed = False
                self._serve(conn, addr, addr)
            self.stop.wait(1.0)

    def _serve(self, conn: socket.socket, dialed: str | None, source: str) -> None:
        """One connection: handshake, then converse until it ends. `source` is the address
        dialed (outbound) or the TCP source address (inbound)."""
        who = dialed or f"inbound from {source}"
        with conn:
            conn.settimeout(1.0)
            buf = b""
            try:
                if dialed:
                    conn.sendall(self._hello(announce=True))
                line, buf = _read_line(conn, buf, deadline=time.monotonic() + 5.0)
                hello = parse_hello(line)
                if hello is None:
                    log(f"p2p: {who}: bad handshake {line[:60]!r}")
                    return
                version, blocks, announced, fields = hello
                if not dialed:  # answer in the form the dialer speaks (an old one wants 3)
                    conn.sendall(self._hello(announce=fields == 4))
            except OSError:
                return
            if fields == 4 and announced is None:
                log(f"p2p: {who}: ignoring a bad public endpoint in its HELLO")
            if dialed:
                link = Link("out", dialed, True, blocks)
            elif announced:
                link = Link("in", announced, True, blocks)
            else:
                link = Link("in", source, False, blocks)
            with self.lock:
                self._ids += 1
                cid = self._ids
                self.live[cid] = link
            log(f"p2p: peer up ({link.dir} {link.remote}, {version[:32]!r}, {blocks} blocks)")
            try:
                self._converse(conn, buf, cid, dialed)
            except OSError:
                pass
            finally:
                with self.lock:
                    self.live.pop(cid, None)
                log(f"p2p: peer down ({who})")

    def _converse(self, conn: socket.socket, buf: bytes, cid: int, dialed: str | None) -> None:
        last_heard = next_ping = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if now - last_heard > PEER_SILENT_S:
                return
            if dialed:
                with self.lock:
                    if dialed not in self.wanted:
                        return
            if now >= next_ping:
                conn.sendall(f"PING {self.blocks()}\n".encode())
                next_ping = now + PING_EVERY_S
            try:
                line, buf = _read_line(conn, buf, deadline=now + 1.0)
            except TimeoutError:
                continue
            except OSError:
                return
            last_heard = time.monotonic()
            blocks = _reported_blocks(line)
            if blocks is not None:
                with self.lock:
                    if cid in self.live:
                        self.live[cid].blocks = blocks

    def _hello(self, announce: bool) -> bytes:
        """Our HELLO; with our public endpoint as a 4th field when we know one and announce."""
        tail = f" {self.hello_public}" if announce and self.hello_public else ""
        return f"HELLO {VERSION} {self.blocks()}{tail}\n".encode()


def _reported_blocks(line: str) -> int | None:
    """The height in a PING (or a repeated HELLO) after the handshake; None for other lines."""
    parts = line.split()
    if len(parts) == 2 and parts[0] == "PING":
        return count_field(parts[1])
    hello = parse_hello(line)
    return hello[1] if hello else None


def parse_hello(line: str) -> tuple[str, int, str | None, int] | None:
    """(version, blocks, announced public endpoint or None, field count) of a HELLO line; None
    when it is not one. The 4th field is optional (older nodes send 3) and a bad one reads as
    absent rather than failing the handshake."""
    parts = line.split()
    if len(parts) not in (3, 4) or parts[0] != "HELLO":
        return None
    blocks = count_field(parts[2])
    if blocks is None:
        return None
    announced = public_endpoint(parts[3]) if len(parts) == 4 else None
    return parts[1], blocks, announced, len(parts)


def _read_line(conn: socket.socket, buf: bytes, deadline: float) -> tuple[str, bytes]:
    """One line from conn; TimeoutError past the deadline, ConnectionError on EOF."""
    while b"\n" not in buf:
        if time.monotonic() >= deadline:
            raise TimeoutError
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
        if len(buf) > 65536:
            raise ConnectionError("line too long")
    line, _, rest = buf.partition(b"\n")
    return line.decode(errors="replace").strip(), rest


def read_peers(args: argparse.Namespace) -> list[str]:
    addrs = [a.strip() for a in (args.peers or "").split(",") if a.strip()]
    if args.peers_file:
        try:
            text = Path(args.peers_file).read_text()
        except OSError:
            text = ""
        for line in text.splitlines():
            line = line.split("#", 1)[0]
            addrs += [a for a in line.replace(",", " ").split() if a]
    return addrs


def node_status(chain: Chain, knobs: Knobs, p2p: P2P) -> dict[str, Any]:
    """GET /status: the chain's figures plus the peer fields, counts and list from one view."""
    peers = p2p.view()
    status = chain.status(knobs.values, peers["peers"])
    status.update(peers)
    return status


def make_rpc(port: int, status: Callable[[], dict[str, Any]]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/status":
                code, body = 200, status()
            else:
                code, body = 404, {"error": "not found; try /status"}
            data = (json.dumps(body) + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="igneumd", description="Igneum node (sandbox simulator)")
    p.add_argument("--version", action="version", version=f"igneumd {VERSION}")
    p.add_argument("--datadir", required=True, type=Path)
    p.add_argument("--p2p-port", required=True, type=int)
    p.add_argument("--p2p-public", help="HOST:PORT other boxes reach us at (never dialed)")
    p.add_argument("--peers", help="HOST:PORT,... to dial")
    p.add_argument("--peers-file", type=Path, help="HOST:PORT per line, re-read every second")
    p.add_argument("--rpc-port", required=True, type=int)
    p.add_argument("--knobs", type=Path, help="knob file (default DATADIR/knobs.json)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    datadir: Path = args.datadir
    datadir.mkdir(parents=True, exist_ok=True)
    lock = open(datadir / "igneumd.lock", "a")  # held for the process's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"igneumd: error: datadir {datadir} is in use by another igneumd", file=sys.stderr)
        return 2
    knobs = Knobs(args.knobs or datadir / "knobs.json")
    knobs.reload()
    chain = Chain(datadir / "state.json", knobs.values)
    try:
        p2p = P2P(args.p2p_port, args.p2p_public, lambda: int(chain.height))
        rpc = make_rpc(args.rpc_port, lambda: node_status(chain, knobs, p2p))
    except OSError as exc:
        print(f"igneumd: error: cannot listen: {exc}", file=sys.stderr)
        return 1
    if args.p2p_public and p2p.hello_public is None:
        log(f"p2p: --p2p-public {args.p2p_public[:80]!r} is not a HOST:PORT; not announcing it")
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    signal.signal(signal.SIGINT, lambda *_: STOP.set())
    threading.Thread(target=p2p.accept_loop, daemon=True).start()
    threading.Thread(target=rpc.serve_forever, daemon=True).start()
    log(f"{VERSION} up: p2p 0.0.0.0:{args.p2p_port} (public {args.p2p_public or '-'}), "
        f"rpc 127.0.0.1:{args.rpc_port}, datadir {datadir}")

    started = last = time.monotonic()
    next_second = started
    while not STOP.is_set():
        now = time.monotonic()
        if now >= next_second:
            next_second = now + 1.0
            knobs.reload()
            p2p.set_wanted(read_peers(args))
            if (datadir / "exec.snapshot").exists():
                knobs.clear_exec_stuck()
                (datadir / "exec.snapshot").unlink(missing_ok=True)
                log("exec snapshot applied: exec tip follows blocks again")
            chain.save()
        crash_after = knobs.values["crash_after_s"]
        if knobs.values["crash_now"] or (crash_after is not None and now - started >= crash_after):
            chain.save()
            print("igneumd: crashing on purpose (knob)", file=sys.stderr, flush=True)
            os._exit(1)
        chain.tick(now - last, knobs.values, p2p.best())
        last = now
        STOP.wait(0.1)
    log("SIGTERM: saving and stopping")
    rpc.shutdown()
    p2p.server.close()
    chain.save()
    return 0


if __name__ == "__main__":
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    sys.exit(main(sys.argv[1:]))
