"""The meter watchdog: one-shot boxes that bill for nothing.

A live one-shot box is flagged when it is past its deadline (the box's own wherever its agent
tells one: the start of the step, gate or run in progress, or the end of the last step, plus
the job's TTL; otherwise, before the job's first step, the registry's from the rent), never later
than the row's cap (jobstate.cap_at: what the job's agent allows at most; the box's record is
not the operator's), when its
job has ended (finished, failed, interrupted or refused) and it still runs, when it has had no
job for NO_JOB_GRACE_MIN minutes, when a teardown kept it (its outputs could not be verified:
reported on every check, never destroyed silently), and when its job's state cannot be read at
all (SSH failing, the agent failing: unknown is not well). The first three are `due`: what
`fleet teardown --expired` tears down, but for a box a teardown kept for a lasting reason (the
row's `kept_lasting` names its job): that one is not pulled again on every pass
(`fleet.ops.teardown`), only reported here.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agent.contract import TERMINAL
from fleet.boxes import jobstate
from fleet.core.errors import FleetError
from fleet.core.states import BoxKind
from fleet.core.times import parse_iso
from fleet.core.verdicts import Watch

if TYPE_CHECKING:
    from fleet.core.boxes import Row
    from fleet.core.config import Config
    from fleet.state.registry import Registry

NO_JOB_GRACE_MIN = 30.0  # a one-shot box rented without a job is flagged after this


def _minutes(ts: str | None, now: datetime) -> float | None:
    if not ts:
        return None
    return (parse_iso(ts) - now).total_seconds() / 60


def judge(row: Row, state: dict[str, Any] | None, read_error: str | None,
          now: datetime) -> Watch:
    created = _minutes(row.created_at, now)
    phase = (state or {}).get("phase") if state is not None else row.job_state
    left = _minutes(row.expires_at, now)
    at = jobstate.deadline({}, state) if state and state.get("deadline_at") else None
    if at is not None:  # the box's own: its run's or its running gate's start plus the TTL,
        # by the box's clock (a box whose clock is off is judged in its own time)
        left = (at - jobstate.box_time((state or {}).get("box_now") or now.timestamp())
                ).total_seconds() / 60
    cap = jobstate.cap_at(row)
    cap_left = None if cap is None else (cap - now).total_seconds() / 60
    if cap_left is not None and left is not None and cap_left < left:
        # the box says its job runs on past the latest a job could: the cap holds, never later
        w_cap = f"the box says {left:.0f} min more, past the cap its job allows"
        left = cap_left
    else:
        w_cap = None
    w = Watch(row.label, row.job, phase, -(created or 0.0), left)
    if w_cap:
        w.problems.append(w_cap)
    if row.teardown:
        w.problems.append(f"teardown {row.teardown}")
    if read_error:
        w.problems.append(f"job state unknown: {read_error}")
    if left is not None and left <= 0:
        w.problems.append(f"past its deadline by {-left:.0f} min; the meter is running")
        w.due = True
    if phase in TERMINAL:
        w.problems.append(f"job {phase}, box still billing: fleet teardown {row.label}")
        w.due = True
    if not row.job and w.age_min >= NO_JOB_GRACE_MIN:
        w.problems.append(f"no job after {w.age_min:.0f} min, box still billing: give it one "
                          f"or fleet teardown {row.label}")
        w.due = True
    return w


def watch(cfg: Config, reg: Registry, now: datetime | None = None) -> list[Watch]:
    """Every live one-shot box, its job's state read from the box (and recorded)."""
    now = now or datetime.now(UTC)
    rows = [r for r in reg.live_rows() if r.kind == BoxKind.ONESHOT]

    def read(row: Row) -> tuple[dict[str, Any] | None, str | None]:
        if not row.job:
            return None, None
        try:
            return jobstate.job_state(cfg, row, row.job), None
        except FleetError as e:
            return None, str(e)
        except Exception as e:  # noqa: BLE001 - one box's fault is its line, never the pass's
            return None, f"{row.label}: {type(e).__name__}: {e}"

    with ThreadPoolExecutor(max_workers=16) as pool:
        reads = list(pool.map(read, rows))
    out = []
    for row, (state, error) in zip(rows, reads, strict=True):
        if state and jobstate.changed(row, state):  # a write is a registry transaction
            jobstate.record(reg, row.label, state)
        out.append(judge(row, state, error, now))
    return out
