"""A job's deadline counts from the start of what it does now, as the box's agent recorded it:
never from the rent. Provisioning, the install and a cold fetch do not eat a gate's or the
run's ttl, and the watchdog does not call such a job due."""

from __future__ import annotations

import socket
import subprocess
from datetime import UTC, datetime, timedelta

from agentbox import PY, Box, wait_for
from jobtools import HUB_TOKEN, step_ok, write_job, write_token

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


def test_a_cold_fetch_counts_its_deadline_from_its_own_start(box: Box) -> None:
    # a store that takes the connection and never answers: the fetch is in progress meanwhile
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen(8)
        jobdir = write_job(box, ttl_minutes=20, store_endpoint=f"http://127.0.0.1:"
                           f"{store.getsockname()[1]}", toolchain={
                               "repo": "fleet/toolchains", "revision": "0" * 40,
                               "path": "toolchain", "repo_type": "dataset"})
        write_token(box, HUB_TOKEN)
        step_ok(box, "admit", jobdir)
        fetching = subprocess.Popen([PY, "-m", "agent", "job", "fetch", str(jobdir)],
                                    env=box.env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        try:
            state = wait_for(lambda: (lambda s: s if (s["step"] or {}).get("name") == "fetch"
                                      else None)(step_ok(box, "state", jobdir)),
                             "the fetch in progress")
            started = state["step"]["started_at"]
            assert started >= state["steps"]["admit"]["ended_at"]
            assert at(state["deadline_at"]) == datetime.fromtimestamp(int(started + 20 * 60),
                                                                       UTC)
        finally:
            fetching.kill()
            fetching.wait()
