"""A one-shot job as its box tells it, over SSH: its state (through the agent, which also
settles a runner that died), its spec, the box's own clock and the deadline it keeps.

A job that never reached the box reads as {} (the probe exits `NOT_STAGED`); a box that cannot
be read (SSH failing, the agent failing, garbled output) raises FleetError: unknown is never
{}."""

from __future__ import annotations

import contextlib
import json
import shlex
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from agent.contract import JOBS, ROOT, VENV_PYTHON
from fleet.boxes import boxssh
from fleet.core.errors import FleetError
from fleet.core.times import parse_iso

if TYPE_CHECKING:
    from fleet.core.boxes import Row
    from fleet.core.config import Config
    from fleet.state.registry import Registry

NOT_STAGED = 7  # the exit status of the state read when the job never reached the box


def job_state(cfg: Config, row: Row, job: str) -> dict[str, Any]:
    """The agent's state of `job` on the box ({} before it was staged). Asked of the agent,
    which also settles a runner that died (interrupted) rather than read stale. A box that
    cannot be read (SSH failing, the agent failing) raises FleetError: unknown is not {}."""
    d = shlex.quote(f"{ROOT}/{JOBS}/{job}")
    res = boxssh.run(cfg, row, f"test -f {d}/job.json || exit {NOT_STAGED}; date +%s && "
                     f"cd {ROOT} && {VENV_PYTHON} -m agent job state {d}")
    if res.returncode == NOT_STAGED:
        return {}
    why = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1][:200]
    if res.returncode != 0:
        raise FleetError(f"{row.label}: cannot read job {job}'s state on the box ({why})")
    box_now, _, text = res.stdout.partition("\n")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise FleetError(f"{row.label}: job {job}'s state on the box is not a JSON object")
    return {**data, "box_now": box_now.strip()}  # the box's clock, for its own deadlines


def job_fields(state: dict[str, Any]) -> dict[str, Any]:
    """The registry fields a job's state (`job_state`'s answer) sets on its box's row."""
    refused = state.get("refused")
    return {"job_state": state.get("phase"), "invocations": state.get("invocations"),
            "refusal": f"{refused.get('step')}: {refused.get('reason')}"
            if isinstance(refused, dict) else None}


def changed(row: Row, state: dict[str, Any]) -> bool:
    """Whether recording `state` would change `row`."""
    return any(getattr(row, k) != v for k, v in job_fields(state).items())


def record(reg: Registry, label: str, state: dict[str, Any]) -> Row:
    return reg.update(label, **job_fields(state))


def read_job(cfg: Config, row: Row, job: str) -> dict[str, Any]:
    """job.json and state.json of the box's job, in one SSH round trip."""
    jobdir = f"{ROOT}/{JOBS}/{job}"
    d = shlex.quote(jobdir)
    # the state through the agent, which also settles a runner that died (interrupted)
    cmd = (f"test -f {d}/job.json || exit {NOT_STAGED}; cd {ROOT} && "
           f"printf '{{\"box_now\": %s, \"spec\": ' \"$(date +%s)\" && cat {d}/job.json && "
           f"printf ', \"state\": ' && "
           f"{{ {VENV_PYTHON} -m agent job state {d} 2>/dev/null || printf null; }} && echo '}}'")
    res = boxssh.run(cfg, row, cmd)
    if res.returncode == NOT_STAGED:
        return {}
    if res.returncode != 0:
        raise FleetError(f"{row.label}: cannot read job {job} on the box "
                         f"({res.stderr.strip()[-200:] or f'exit {res.returncode}'})")
    try:
        data = json.loads(res.stdout)
    except ValueError:
        raise FleetError(f"{row.label}: job {job}'s files on the box are not readable "
                         "JSON") from None
    return data if isinstance(data, dict) else {}


# beyond the registry's deadline (the job's ttl for each gate and the run, from its mark): the
# rent and install, and the toolchain fetch, each under a deadline of its own. Past this cap a
# job is over whatever its box says: the box's deadline is in a file the job can rewrite
CAP_ALLOWANCE_MIN = 60.0
# what the box's agent allows a job, each a full ttl: the fetch, the scan, each gate, the run,
# and the four gaps between admission, fetch, scan, the gates and the run (a job between steps
# counts from its last step's end: agent.job.state.with_deadline)
AGENT_TTLS = 7


def cap_minutes(ttl_minutes: float, gates: int) -> float:
    """From the job's placing, the latest a legitimate job could still run by its agent's own
    deadlines (CAP_ALLOWANCE_MIN for the rent's and the install's tail): past it the box's
    word no longer counts."""
    return CAP_ALLOWANCE_MIN + ttl_minutes * (gates + AGENT_TTLS)


def cap_at(row: Row) -> datetime | None:
    """The row's cap (its `cap_at`; a row placed before it had one: its deadline plus
    CAP_ALLOWANCE_MIN); None when the row has neither."""
    with contextlib.suppress(TypeError, ValueError, OverflowError):
        if row.cap_at:
            return parse_iso(str(row.cap_at))
        if row.expires_at:
            return parse_iso(str(row.expires_at)) + timedelta(minutes=CAP_ALLOWANCE_MIN)
    return None


def past_cap(row: Row, now: datetime) -> bool:
    """Whether the row's cap (cap_at), by the operator's clock, has passed: the box cannot
    move it."""
    at = cap_at(row)
    return at is not None and now >= at


def deadline(spec: dict[str, Any], state: dict[str, Any]) -> datetime | None:
    """When what the job does now must end, by the box's clock: `deadline_at` where the
    agent says it (the run's, a gate's or another step's start, or the last step's end, plus
    the job's TTL: never the rent's time), else the run's `started_at` plus the job's TTL;
    None when the box cannot tell."""
    with contextlib.suppress(TypeError, ValueError, KeyError, OverflowError, OSError):
        if state.get("deadline_at"):
            return parse_iso(str(state["deadline_at"]))
        started = state["started_at"]  # the agent's: unix seconds
        at = datetime.fromtimestamp(float(started), UTC) if isinstance(started, int | float) \
            else parse_iso(str(started))
        return at + timedelta(minutes=float(spec["ttl_minutes"]))
    return None


def box_time(box_now: Any) -> datetime:
    """The box's clock when it answered (`date +%s`), to set against its own deadlines; the
    operator's when it did not say."""
    with contextlib.suppress(TypeError, ValueError, OverflowError, OSError):
        return datetime.fromtimestamp(float(box_now), UTC)
    return datetime.now(UTC)
