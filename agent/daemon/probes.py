"""Reading the programs' own status: the node's RPC and the miner's and prover's status files.

Every probe returns a Reading and never raises: whatever goes wrong (a refused connection, a
malformed HTTP answer, a bad chunk, a file that is not JSON, a number that is not finite) becomes
the reading's error, so one bad answer can never end the thread that probes (see observer.py).
Every probe has a total deadline: an RPC that drips its answer a byte at a time is cut off at
PROBE_DEADLINE_S, not kept alive by each byte. Every reading carries the monotonic time it was
taken, by which freshness.py tells a fresh one from a frozen one.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import stat
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agent.base.config import ProgramConfig
from agent.base.template import Values, render_text

MAX_BODY = 1 << 20  # an RPC answer or a status file larger than this is refused
PROBE_DEADLINE_S = 2.0  # the whole HTTP exchange, connect to last byte
LARGEST = 2.0**63  # a figure beyond a 64-bit integer is garbage, not a reading


class ProbeError(Exception):
    """A probe got no usable answer (kept inside this module: readings carry the text)."""


@dataclass(frozen=True)
class Reading:
    data: dict[str, Any] | None  # the program's JSON, None when unreadable or unknown
    error: str | None
    at: float  # wall time of the probe (for display)
    healthy: bool | None  # None: unknown (no status source, or the reading is stale)
    mono: float = 0.0  # monotonic time of the probe: what freshness is judged by
    stale: bool = False  # older than the freshness limit: nothing may be decided on it
    # monotonic time the figures were written (a status file's last change), None: at `mono`;
    # figures written before a process started are not that process's
    written_mono: float | None = None
    # the earliest they may have been written (a file dated ahead of the clock: only that it
    # changed since the probe before saw it), None: at written_mono
    written_after: float | None = None


def parse_json(raw: bytes, where: str) -> Any:
    """JSON whose every number is finite and within a 64-bit integer's range (NaN, Infinity
    and 1e400 are refused, whatever the reader would make of them)."""
    try:
        value = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
        bad = _out_of_range(value)
    except RecursionError:  # "[" * 200000: garbage, not a reason to end the thread
        raise ProbeError(f"{where}: nested too deep") from None
    except ValueError as e:
        raise ProbeError(f"{where}: {e}" if "finite" in str(e) else f"{where}: not JSON") from None
    if bad is not None:
        raise ProbeError(f"{where}: {bad} is out of range")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _out_of_range(value: Any, path: str = "") -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return f"{path or 'the answer'} = {value:.3g}" if abs(value) >= LARGEST else None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        bad = _out_of_range(item, f"{path}.{key}" if path else str(key))
        if bad:
            return bad
    return None


class _DeadlineSocket(socket.socket):
    """A socket whose every receive waits only for what is left of one total deadline."""

    deadline = 0.0

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the probe's deadline has passed")
        self.settimeout(left)
        return super().recv_into(buffer, nbytes, flags)


class _Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, deadline: float) -> None:
        super().__init__(host, port, timeout=max(0.01, deadline - time.monotonic()))
        self.deadline = deadline

    def connect(self) -> None:
        plain = socket.create_connection((self.host, self.port), self.timeout)
        sock = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        sock.deadline = self.deadline
        self.sock = sock


def http_get_json(url: str, deadline_s: float = PROBE_DEADLINE_S) -> Any:
    """GET an http:// URL and parse its JSON body (http.client: chunked bodies, status line),
    all of it within deadline_s."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ProbeError(f"unsupported URL {url!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = _Connection(parts.hostname, parts.port or 80, time.monotonic() + deadline_s)
    try:
        conn.request("GET", path, headers={"Accept": "application/json"})
        response = conn.getresponse()
        body = response.read(MAX_BODY + 1)
    except TimeoutError:
        raise ProbeError(f"{url}: no complete answer within {deadline_s:g} s") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        detail = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise ProbeError(f"{url}: {detail}") from None
    finally:
        conn.close()
    if response.status != 200:
        raise ProbeError(f"{url}: HTTP {response.status}")
    if len(body) > MAX_BODY:
        raise ProbeError(f"{url}: answer larger than 1 MiB")
    return parse_json(body, url)


def read_status_file(path: str, max_age_s: float) -> Reading:
    now, mono = time.time(), time.monotonic()

    def unhealthy(data: dict[str, Any] | None, error: str) -> Reading:
        return Reading(data, error, now, False, mono)

    try:
        # O_NONBLOCK: a FIFO put in its place must not hang the probe
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return unhealthy(None, f"{path} does not exist")
    except OSError as e:
        return unhealthy(None, f"{path}: {e.strerror or e}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return unhealthy(None, f"{path} is not a regular file")
        if st.st_size > MAX_BODY:
            return unhealthy(None, f"{path} is {st.st_size} bytes, over the 1 MiB cap")
        data = parse_json(os.read(fd, MAX_BODY + 1), path)
    except ProbeError as e:
        return unhealthy(None, str(e))
    except OSError as e:
        return unhealthy(None, f"{path}: {e.strerror or e}")
    finally:
        os.close(fd)
    if not isinstance(data, dict):
        return unhealthy(None, f"{path} does not hold a JSON object")
    written, after = _changed_at(path, st, now, mono)
    if mono - written > max_age_s:
        return Reading(data, f"{path} unchanged for {mono - written:.0f} s", now, False, mono,
                       written_mono=written, written_after=after)
    return Reading(data, None, now, True, mono, written_mono=written, written_after=after)


FUTURE_TOLERANCE_S = 1.0
# path -> (identity, changed at, changed no earlier than, last seen), on the monotonic clock
_SEEN: dict[str, tuple[tuple[int, int, int], float, float, float]] = {}


def _changed_at(path: str, st: os.stat_result, now: float, mono: float) -> tuple[float, float]:
    """When a status file last changed, on the monotonic clock, and the earliest it may have:
    when the probe saw its identity (inode, mtime, size) change. Each change is dated by the
    file's wall-clock age, never negative, and the file ages from there. An mtime ahead of the
    clock (a step back after the write, or a writer that set it) cannot date the change: it
    counts as just written for its age, and as written no earlier than the probe before saw
    the file (never seen: at any time), so it is nobody's figures who started since."""
    ident = (st.st_ino, st.st_mtime_ns, st.st_size)
    seen = _SEEN.get(path)
    if seen is None or seen[0] != ident:
        if st.st_mtime <= now + FUTURE_TOLERANCE_S:
            changed = after = mono - max(0.0, now - st.st_mtime)
        else:
            changed, after = mono, (-math.inf if seen is None else seen[3])
        seen = (ident, changed, after, mono)
    _SEEN[path] = (*seen[:3], mono)
    return seen[1], seen[2]


def probe_program(program: ProgramConfig, values: Values) -> Reading:
    now, mono = time.time(), time.monotonic()
    try:
        if program.status_url:
            try:
                data = http_get_json(program.status_url)
            except ProbeError as e:
                return Reading(None, str(e), now, False, mono)
            if not isinstance(data, dict):
                return Reading(None, "status RPC answered no JSON object", now, False, mono)
            return Reading(data, None, now, True, mono)
        if program.status_file:
            path = render_text(program.status_file, values)
            if path:
                return read_status_file(path, program.health_max_age_s)
    except Exception as e:  # a probe never ends the observer: the failure is the reading
        return Reading(None, f"probe failed: {type(e).__name__}: {e}", now, False, mono)
    return Reading(None, None, now, None, mono)
