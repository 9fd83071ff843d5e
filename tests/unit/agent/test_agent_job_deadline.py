"""A job's deadline counts from the start of what it does now, as the box's agent recorded it:
never from the rent. Provisioning, the install and a cold fetch do not eat a gate's or the
run's ttl, and the watchdog does not call such a job due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agentbox import Box
from jobtools import step_ok, write_job

from fleet.core.boxes import Row
from fleet.ops.watchdog import judge


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_job_between_steps_has_the_deadline_of_its_last_steps_end(box: Box) -> None:
    jobdir = write_job(box, ttl_minutes=20)
    step_ok(box, "admit", jobdir)
    state = step_ok(box, "fetch", jobdir)
    ended = state["steps"]["fetch"]["ended_at"]
    assert state["deadline_at"] is not None, state
    assert at(state["deadline_at"]) == datetime.fromtimestamp(int(ended + 20 * 60), UTC)


def test_a_rent_that_took_longer_than_the_jobs_deadline_does_not_make_it_due(box: Box) -> None:
    jobdir = write_job(box, ttl_minutes=20)
    step_ok(box, "admit", jobdir)
    state = step_ok(box, "state", jobdir)
    now = datetime.now(UTC)
    # the box took 50 min to provision and install: the rent's deadline (20 min x 1) is past
    row = Row(label="bench-vast-1", provider="vast", role="bench", kind="oneshot",
              card="RTX 4090", gpu_count=1, usd_per_hour=0.4, status="running", job="bench",
              created_at=(now - timedelta(minutes=50)).isoformat(),
              expires_at=(now - timedelta(minutes=30)).isoformat())
    w = judge(row, {**state, "box_now": now.timestamp()}, None, now)
    assert not w.due, w.problems
    assert w.ttl_left_min is not None and 19 < w.ttl_left_min <= 20
