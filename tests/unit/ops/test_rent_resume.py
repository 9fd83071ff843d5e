"""Re-running `fleet rent ROLE --label X` after a crash resumes the rent instead of refusing.

A crash leaves the label's row `renting` (before or after the provider call), `provisioning`,
or `running` without a pinned host key (while waiting for SSH). The rerun looks the label up
at the row's provider: a box found is recorded and waited for; none found is rented under the
same label, budget checked. Labels of complete, destroyed or failed boxes stay refused.
"""

from __future__ import annotations

import json

import pytest
from cli_sandbox import FleetRun

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeHostKeyForTheResumeTests0000000000000"


def test_crash_before_the_provider_call_rents_under_the_same_label(fleet: FleetRun) -> None:
    fleet.row("bench-r-1", status="renting")
    r = fleet("rent", "bench", "--label", "bench-r-1", "--provider", "vast", "--no-wait",
              "--json")
    assert r.code == 0, r.err
    (box,) = fleet.boxes("vast", "bench-r-1")
    (row,) = fleet.reg.rows()
    assert row.label == "bench-r-1" and row.provider_id == box.box_id and row.live
    assert json.loads(r.out)["provider_id"] == box.box_id


@pytest.mark.parametrize("status, with_id", [("renting", False), ("renting", True),
                                             ("provisioning", True), ("running", True)])
@pytest.mark.parametrize("provider", ["vast", "runpod"])
def test_crash_after_the_create_landed_records_the_box_and_waits_for_ssh(
        fleet: FleetRun, monkeypatch: pytest.MonkeyPatch, provider: str, status: str,
        with_id: bool) -> None:
    monkeypatch.setattr("fleet.boxes.lifecycle.fetch_host_key",
                        lambda host, port, timeout=10.0: KEY)
    box = fleet.land(provider, "bench-r-2")
    fleet.row("bench-r-2", provider=provider, status=status,
              provider_id=box.box_id if with_id else None)
    r = fleet("rent", "bench", "--label", "bench-r-2", "--json")
    assert r.code == 0, r.err
    assert [b.box_id for b in fleet.boxes(provider, "bench-r-2")] == [box.box_id]  # no second
    (row,) = fleet.reg.rows()
    assert row.provider_id == box.box_id and row.status == "running" and row.host_key == KEY
    assert row.ssh_host and row.ssh_port
    known = (fleet.tmp_path / "state" / "known_hosts").read_text()
    assert known == f"[{row.ssh_host}]:{row.ssh_port} {KEY}\n"


def test_the_rent_again_is_budget_checked(fleet: FleetRun) -> None:
    fleet.config(budget=0.000001)
    fleet.row("bench-r-3", status="renting")
    before = fleet.registry_bytes()
    r = fleet("rent", "bench", "--label", "bench-r-3", "--provider", "vast", "--no-wait")
    assert r.code == 3, r.err
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("error: "), r.err
    assert "daily budget" in r.err
    assert fleet.registry_bytes() == before
    assert fleet.boxes("vast", "bench-r-3") == []


def test_the_unfinished_row_is_not_counted_beside_its_replacement(fleet: FleetRun) -> None:
    # the crashed attempt was priced at $1 a second: what it has "cost" since it was written
    # stays counted (well within $100), but were it counted as live until midnight beside the
    # new box, nothing would fit; the new box takes its place instead
    fleet.row("bench-r-4", status="renting", usd_per_hour=3600.0)
    r = fleet("rent", "bench", "--label", "bench-r-4", "--provider", "vast", "--no-wait")
    assert r.code == 0, r.err
    (box,) = fleet.boxes("vast", "bench-r-4")
    (row,) = fleet.reg.rows()
    assert row.provider_id == box.box_id and row.usd_per_hour < 10  # the new price


@pytest.mark.parametrize("fields, says", [
    (dict(status="running", provider_id="1", host_key=KEY), "already"),
    (dict(status="exited", provider_id="1", host_key=KEY), "already"),
    (dict(status="destroyed", provider_id="1", destroyed_at="2026-01-01T00:00:00Z"), "destroyed"),
    (dict(status="failed", destroyed_at="2026-01-01T00:00:00Z"), "failed"),
])
def test_labels_of_complete_destroyed_or_failed_boxes_stay_refused(
        fleet: FleetRun, fields: dict[str, object], says: str) -> None:
    fleet.row("bench-r-5", **fields)
    before = fleet.registry_bytes()
    r = fleet("rent", "bench", "--label", "bench-r-5", "--provider", "vast", "--no-wait")
    assert r.code == 2, r.err
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("error: "), r.err
    assert "bench-r-5" in r.err and says in r.err and "Traceback" not in r.err
    assert fleet.registry_bytes() == before
    assert fleet.boxes("vast", "bench-r-5") == []


@pytest.mark.parametrize("args, says", [
    (["rent", "live", "--label", "bench-r-6"], "role bench"),  # the row was for bench
    (["rent", "bench", "--label", "bench-r-6", "--provider", "runpod"], "vast"),
])
def test_a_resume_that_contradicts_the_row_is_refused(fleet: FleetRun, args: list[str],
                                                      says: str) -> None:
    fleet.row("bench-r-6", status="renting")
    before = fleet.registry_bytes()
    r = fleet(*args, "--no-wait")
    assert r.code == 2, r.err
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("error: "), r.err
    assert says in r.err
    assert fleet.registry_bytes() == before
    assert fleet.boxes("vast", "bench-r-6") == fleet.boxes("runpod", "bench-r-6") == []


def test_a_resume_whose_provider_has_no_key_is_refused(fleet: FleetRun,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fleet.row("bench-r-7", status="renting")
    before = fleet.registry_bytes()
    monkeypatch.delenv("VAST_API_KEY")
    r = fleet("rent", "bench", "--label", "bench-r-7", "--no-wait")
    assert r.code == 2, r.err
    assert len(r.err_lines) == 1 and "VAST_API_KEY" in r.err, r.err
    assert fleet.registry_bytes() == before


def test_dry_run_of_a_resume_names_the_box_and_changes_nothing(fleet: FleetRun) -> None:
    box = fleet.land("vast", "bench-r-8")
    fleet.row("bench-r-8", status="renting")
    before = fleet.registry_bytes()
    r = fleet("rent", "bench", "--label", "bench-r-8", "--dry-run")
    assert r.code == 0, r.err
    assert f"would resume bench-r-8: record vast box {box.box_id}" in r.out
    assert fleet.registry_bytes() == before


def test_a_new_rent_under_a_label_a_persons_boxes_carry_is_refused_and_destroys_none(
        fleet: FleetRun) -> None:
    """Found by a review: a person's two boxes labelled web1 in the console; `fleet rent
    --label web1` took the older as its rented box (a label is the create's idempotency key)
    and destroyed the other. Every rent writes its row first, so a box already under a new
    rent's label is never the fleet's: the rent is refused, nothing written or destroyed."""
    a = fleet.land("vast", "web1")
    b = fleet.land("vast", "web1")
    r = fleet("rent", "bench", "--provider", "vast", "--label", "web1", "--no-wait")
    assert r.code == 2 and len(r.err_lines) == 1, r
    assert "carried by a box this fleet never rented" in r.err, r.err
    assert {x.box_id for x in fleet.boxes("vast", "web1")} == {a.box_id, b.box_id}
    assert fleet.reg.get("web1") is None
