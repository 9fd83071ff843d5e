"""One freshness rule for the whole agent: a reading older than its limit is unknown.

Every reading (a probe of a program, the admission verdict from NVML) carries the monotonic time
it was taken, and its age is measured on that clock only, so a wall-clock step neither freezes
nor ages a reading. A reading past its limit (the observer stuck, NVML hung) is replaced by an
unknown one before anyone sees it: `healthy: null` and no figures in the status, `-` in the
RESULT line, no unhealthy restart, no recovery recipe and no pack export decided on it. For
admission, unknown is a refusal: a guard that cannot tell says no.

Likewise a reading of a program that is not running now, or one whose figures were written
before its current process started (a status file's last change, not when the probe read it),
is unknown: a dead miner's status file still reads fresh for a while, but its figures are not
current, not even for a successor that never writes one (`-` in the RESULT line). And an
unhealthy reading (a status file unchanged past its health age) carries its reason, no figures.
"""

from __future__ import annotations

import time

from agent.base.config import Config
from agent.daemon.probes import PROBE_DEADLINE_S, Reading

ADMISSION_SLACK_S = 10.0  # NVML init and queries on a busy box


def reading_limit_s(cfg: Config) -> float:
    """A probe reading is fresh for three ticks (two probe deadlines of slack)."""
    return 3 * cfg.tick_s + 2 * PROBE_DEADLINE_S


def admission_limit_s(cfg: Config) -> float:
    """An admission verdict is fresh for three of its checks (one per reconcile)."""
    return 3 * max(cfg.reconcile_s, cfg.tick_s) + ADMISSION_SLACK_S


def age_s(mono: float, now: float | None = None) -> float:
    return max(0.0, (time.monotonic() if now is None else now) - mono)


def fresh_readings(readings: dict[str, Reading], limit_s: float,
                   now: float | None = None) -> dict[str, Reading]:
    """The readings, each one older than limit_s replaced by an unknown one."""
    now = time.monotonic() if now is None else now
    if all(now - r.mono <= limit_s for r in readings.values()):
        return readings
    return {name: r if now - r.mono <= limit_s else unknown(r, now - r.mono)
            for name, r in readings.items()}


def unknown(reading: Reading, age: float) -> Reading:
    return Reading(None, f"no fresh reading: the last is {age:.0f} s old", reading.at, None,
                   reading.mono, stale=True)


def of_running(readings: dict[str, Reading], started: dict[str, float | None],
               max_age: dict[str, float], now: float | None = None) -> dict[str, Reading]:
    """The readings as they stand for each program's current process (`started`: the
    monotonic start of it, None when it has none): a program that is not running has no
    reading; figures written before its start (or that may have been: written_after) are not
    its own, and are unknown until its max_age since its start has passed with nothing of its
    own written, when it is unhealthy; an unhealthy reading is stripped of its figures."""
    now = time.monotonic() if now is None else now
    out = {}
    for name, r in readings.items():
        since = started.get(name)
        written = r.mono if r.written_mono is None else min(r.mono, r.written_mono)
        after = written if r.written_after is None else min(written, r.written_after)
        if r.stale:
            pass  # unknown already
        elif since is None:
            r = Reading(None, "not running", r.at, None, r.mono)
        elif after < since:
            quiet = now - since
            limit = max_age.get(name)
            r = Reading(None, f"nothing written since its start {quiet:.0f} s ago", r.at,
                        False, r.mono) if limit is not None and quiet > limit else \
                Reading(None, "no reading since its start", r.at, None, r.mono)
        elif r.healthy is False and r.data is not None:
            r = Reading(None, r.error, r.at, False, r.mono, r.stale, r.written_mono,
                        r.written_after)
        out[name] = r
    return out
