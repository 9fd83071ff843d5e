"""Reading the programs' own status: the node's RPC and the miner's and prover's status files.

Probes and the NVML admission check run in one background thread (the Observer) so that a
hung node or a slow driver never delays the supervision loop; the loop reads the latest
readings at each tick.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agent.config import Config, ProgramConfig
from agent.gpu import Admission
from agent.template import Values, render_text

MAX_BODY = 1 << 20
HTTP_TIMEOUT_S = 2.0


class ProbeError(Exception):
    """A probe got no usable answer (kept inside this module: readings carry the text)."""


@dataclass(frozen=True)
class Reading:
    data: dict[str, Any] | None  # the program's JSON, None when unreadable
    error: str | None
    at: float  # wall time of the probe
    healthy: bool | None  # None: the program has no status source to judge by


def http_get_json(url: str, timeout: float = HTTP_TIMEOUT_S) -> Any:
    """GET an http:// URL and parse the JSON body (a small client: no TLS, no redirects)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ProbeError(f"unsupported URL {url!r}")
    port = parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    request = (
        f"GET {path} HTTP/1.0\r\nHost: {parts.hostname}:{port}\r\n"
        "Accept: application/json\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(request)
            chunks, size = [], 0
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_BODY:
                    raise ProbeError("answer larger than 1 MiB")
    except OSError as e:
        raise ProbeError(f"{url}: {e.strerror or e}") from None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split()
    if len(status) < 2 or not status[1].isdigit():
        raise ProbeError(f"{url}: not an HTTP answer")
    if status[1] != "200":
        raise ProbeError(f"{url}: HTTP {status[1]}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(body)
    try:
        return json.loads(body)
    except ValueError:
        raise ProbeError(f"{url}: answer is not JSON") from None


def _dechunk(body: bytes) -> bytes:
    out = []
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(rest[:size])
        body = rest[size + 2 :]
    return b"".join(out)


def read_status_file(path: str, max_age_s: float) -> Reading:
    now = time.time()
    try:
        with open(path, "rb") as f:
            mtime = os.fstat(f.fileno()).st_mtime
            data = json.loads(f.read())
    except FileNotFoundError:
        return Reading(None, f"{path} does not exist", now, False)
    except (OSError, ValueError) as e:
        return Reading(None, f"{path}: {e}", now, False)
    if not isinstance(data, dict):
        return Reading(None, f"{path} does not hold a JSON object", now, False)
    age = now - mtime
    if age > max_age_s:
        return Reading(data, f"{path} is {age:.0f} s old", now, False)
    return Reading(data, None, now, True)


def probe_program(program: ProgramConfig, values: Values) -> Reading:
    now = time.time()
    if program.status_url:
        try:
            data = http_get_json(program.status_url)
        except ProbeError as e:
            return Reading(None, str(e), now, False)
        if not isinstance(data, dict):
            return Reading(None, "status RPC answered no JSON object", now, False)
        return Reading(data, None, now, True)
    if program.status_file:
        path = render_text(program.status_file, values)
        if path:
            return read_status_file(path, program.health_max_age_s)
    return Reading(None, None, now, None)


class Observer(threading.Thread):
    """Probes every program each tick and re-checks admission each reconcile, in the
    background. `readings` and `admission` are replaced whole, so readers need no lock."""

    def __init__(self, cfg: Config, values: Callable[[str], Values],
                 check_admission: Callable[[], Admission], admission: Admission) -> None:
        super().__init__(name="observer", daemon=True)
        self.cfg = cfg
        self.values = values
        self.check_admission = check_admission
        self.readings: dict[str, Reading] = {}
        self.admission = admission
        self._next_admission = time.monotonic() + cfg.reconcile_s
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.is_set():
            self.readings = {
                name: probe_program(p, self.values(name)) for name, p in self.cfg.programs.items()
            }
            if time.monotonic() >= self._next_admission:
                self.admission = self.check_admission()
                self._next_admission = time.monotonic() + self.cfg.reconcile_s
            self._stop.wait(self.cfg.tick_s)

    def stop(self) -> None:
        self._stop.set()
