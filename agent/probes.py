"""Reading the programs' own status: the node's RPC and the miner's and prover's status files.

Every probe returns a Reading and never raises: whatever goes wrong (a refused connection, a
malformed HTTP answer, a bad chunk, a file that is not JSON) becomes the reading's error, so one
bad answer can never end the thread that probes (see observer.py). Every reading carries the
time it was taken, so a reader can tell a fresh one from a frozen one.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agent.config import ProgramConfig
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
    """GET an http:// URL and parse its JSON body (http.client: chunked bodies, status line)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ProbeError(f"unsupported URL {url!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept": "application/json"})
        response = conn.getresponse()
        body = response.read(MAX_BODY + 1)
    except (OSError, http.client.HTTPException, ValueError) as e:
        detail = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise ProbeError(f"{url}: {detail}") from None
    finally:
        conn.close()
    if response.status != 200:
        raise ProbeError(f"{url}: HTTP {response.status}")
    if len(body) > MAX_BODY:
        raise ProbeError(f"{url}: answer larger than 1 MiB")
    try:
        return json.loads(body)
    except ValueError:
        raise ProbeError(f"{url}: answer is not JSON") from None


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
    try:
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
    except Exception as e:  # a probe never ends the observer: the failure is the reading
        return Reading(None, f"probe failed: {type(e).__name__}: {e}", now, False)
    return Reading(None, None, now, None)
