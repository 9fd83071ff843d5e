"""The meter watchdog's verdicts, and the budget's view of a one-shot box's TTL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import page_fixture
import pytest

from fleet.boxes import jobstate
from fleet.core.boxes import Row
from fleet.ops import budget
from fleet.ops.watchdog import judge, watch
from fleet.state.registry import Registry

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def row(**kw: object) -> Row:
    base: dict[str, object] = dict(
        label="bench-vast-1", provider="vast", role="bench", kind="oneshot", card="RTX 4090",
        gpu_count=1, usd_per_hour=0.4, status="running", job="fma",
        created_at=iso(NOW - timedelta(minutes=20)),
        expires_at=iso(NOW + timedelta(minutes=10)))
    base.update(kw)
    return Row(**base)  # type: ignore[arg-type]


def test_a_running_job_within_its_ttl_is_well() -> None:
    w = judge(row(), {"phase": "running"}, None, NOW)
    assert w.well and round(w.age_min) == 20 and round(w.ttl_left_min or 0) == 10


def test_past_the_ttl_is_flagged() -> None:
    w = judge(row(expires_at=iso(NOW - timedelta(minutes=5))), {"phase": "running"}, None, NOW)
    assert w.problems == ["past its deadline by 5 min; the meter is running"]


def test_an_ended_or_refused_job_on_a_live_box_is_flagged() -> None:
    for phase in ("finished", "failed", "interrupted", "refused"):
        w = judge(row(), {"phase": phase}, None, NOW)
        assert w.problems == [f"job {phase}, box still billing: fleet teardown bench-vast-1"]


def test_a_kept_box_is_reported_on_every_check() -> None:
    w = judge(row(teardown="kept: out/a.bin: the archive has sha256 ab.."),
              {"phase": "finished"}, None, NOW)
    assert w.problems[0].startswith("teardown kept: out/a.bin")


def test_an_unreadable_state_is_not_well_and_keeps_the_last_known_phase() -> None:
    w = judge(row(job_state="running"), None, "box did not answer", NOW)
    assert not w.well and w.phase == "running"
    assert w.problems == ["job state unknown: box did not answer"]


def test_the_budget_counts_a_one_shot_box_for_its_ttl_only() -> None:
    noon = NOW
    live = row(created_at=iso(noon), expires_at=iso(noon + timedelta(hours=1)))
    p = budget.project([live], 100.0, 2.0, now=noon, new_hours=0.5)
    assert round(p.committed_usd, 6) == 0.4  # one hour left of its TTL, not twelve
    assert round(p.new_usd, 6) == 1.0  # half an hour at $2/h, not until midnight
    # past its TTL it still bills, and nothing says when it stops: until midnight
    late = budget.project([row(expires_at=iso(noon - timedelta(hours=1)))], 100.0, now=noon)
    assert round(late.committed_usd, 6) == round(0.4 * 12, 6)


def test_a_box_deadline_the_job_pushed_back_is_due_at_the_cap() -> None:
    # the job rewrote its state.json: its step started "now" and ends in 2099
    state = {"phase": "gated", "deadline_at": "2099-01-01T00:00:00Z",
             "box_now": str(NOW.timestamp())}
    w = judge(row(expires_at=iso(NOW - timedelta(minutes=61))), state, None, NOW)
    assert w.due and round(w.ttl_left_min or 0) == -1
    assert "past the cap its job allows" in w.problems[0]


def test_a_box_deadline_within_every_step_the_agent_allows_is_not_cut_by_the_cap() -> None:
    # a 600-min job, no gates: its fetch took 300 min and its run is 400 min in; the agent
    # allows each step and each gap a full ttl, and so does the cap set when the job was placed
    placed = NOW - timedelta(minutes=710)
    state = {"phase": "running", "deadline_at": iso(NOW + timedelta(minutes=200)),
             "box_now": str(NOW.timestamp())}
    cap = placed + timedelta(minutes=jobstate.cap_minutes(600, 0))
    w = judge(row(expires_at=iso(placed + timedelta(minutes=600)), cap_at=iso(cap)), state,
              None, NOW)
    assert not w.due and round(w.ttl_left_min or 0) == 200 and not w.problems
    forged = {**state, "deadline_at": "2099-01-01T00:00:00Z"}  # the cap still holds
    w = judge(row(expires_at=iso(placed + timedelta(minutes=600)), cap_at=iso(cap)), forged,
              None, NOW)
    assert round(w.ttl_left_min or 0) == round((cap - NOW).total_seconds() / 60)


def test_a_box_deadline_earlier_than_the_cap_holds() -> None:
    state = {"phase": "running", "deadline_at": iso(NOW - timedelta(minutes=2)),
             "box_now": str(NOW.timestamp())}
    w = judge(row(expires_at=iso(NOW + timedelta(minutes=30))), state, None, NOW)
    assert w.due and round(w.ttl_left_min or 0) == -2


def test_a_box_deadline_within_the_cap_holds_past_the_rents() -> None:
    # a cold fetch counts from its own start: a little past the registry's deadline is its due
    state = {"phase": "admitted", "deadline_at": iso(NOW + timedelta(minutes=20)),
             "box_now": str(NOW.timestamp())}
    w = judge(row(expires_at=iso(NOW - timedelta(minutes=10))), state, None, NOW)
    assert not w.due and round(w.ttl_left_min or 0) == 20


def test_a_watch_writes_the_registry_only_for_the_boxes_whose_job_state_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # each write rewrites the whole registry: one a one-shot box a pass is quadratic
    cfg = page_fixture.config(tmp_path)
    reg = Registry(cfg.registry)
    for i in range(30):
        reg.add(row(label=f"bench-vast-{i}", job_state="running", invocations=1))
    states = {f"bench-vast-{i}": {"phase": "running", "invocations": 1} for i in range(30)}
    states["bench-vast-7"] = {"phase": "finished", "invocations": 1}
    monkeypatch.setattr(jobstate, "job_state", lambda _cfg, r, _job: states[r.label])
    writes = []
    update = Registry.update

    def counted(self: Registry, label: str, **changes: Any) -> Row:
        writes.append(label)
        return update(self, label, **changes)

    monkeypatch.setattr(Registry, "update", counted)
    watched = watch(cfg, reg, NOW)
    assert len(watched) == 30 and writes == ["bench-vast-7"]
    assert reg.get("bench-vast-7").job_state == "finished"  # type: ignore[union-attr]
    assert {r.job_state for r in reg.rows() if r.label != "bench-vast-7"} == {"running"}
