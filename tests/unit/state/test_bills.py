"""Spent today from the providers' bills: a bill above the estimate replaces it (and so can
refuse a rent the estimate would let through), one below never lowers it, the price fills the
time after a lagging bill's end, and charges for boxes no row names count; a stale bill, a bill
of yesterday, a failed or garbled provider, a 5xx storm on the fake providers, or a box the
bill does not name falls back to the estimate, and says why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from state_fixture import sql

from fleet.core.boxes import Row
from fleet.core.errors import BudgetExceeded, ProviderError
from fleet.ops import budget
from fleet.providers.base import RentRequest
from fleet.providers.factory import get_provider
from fleet.providers.http import RetryPolicy
from fleet.state import bills
from sandbox.daemon import Sandbox
from sandbox.frozen import T0, frozen_sandbox

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def row(label: str, box_id: str, usd_h: float = 0.5) -> Row:
    return Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=usd_h, status="running", provider_id=box_id,
               created_at="2026-12-03T00:00:00Z")


class Billing:
    name = "vast"

    def __init__(self, charged: dict[str, float] | None) -> None:
        self.charged = charged
        self.asked: list[tuple[datetime, datetime]] = []

    def charges(self, since: datetime, until: datetime) -> dict[str, float]:
        self.asked.append((since, until))
        if self.charged is None:
            raise ProviderError("vast", "GET /api/v0/charges/", "HTTP 503")
        return self.charged


def test_a_bill_replaces_the_estimate_and_the_time_since_it_is_added(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    p = Billing({"1": 9.0})
    bills.refresh(reg, {"vast": p, "runpod": object()}, NOW)  # RunPod reports no bills
    assert p.asked == [(NOW.replace(hour=0), NOW)]
    rows = [row("billed", "1"), row("unnamed", "2")]
    later = NOW + timedelta(minutes=6)
    spent = bills.billed(rows, bills.load(reg), later)
    assert spent == {"billed": pytest.approx(9.0 + 0.5 * 0.1)}  # + 6 minutes at $0.5/h
    day = budget.project(rows, 100, now=later, billed=spent)
    assert day.spent_usd == pytest.approx(9.05 + 0.5 * 12.1)  # the unnamed box: estimated


def test_a_stale_bill_or_a_failed_provider_is_estimated(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    bills.refresh(reg, {"vast": Billing({"1": 9.0})}, NOW)
    assert bills.billed([row("b", "1")], bills.load(reg),
                        NOW + timedelta(seconds=bills.MAX_AGE_S + 1)) == {}
    failed = bills.refresh(reg, {"vast": Billing(None)}, NOW)
    assert "HTTP 503" in failed.errors["vast"]
    assert bills.billed([row("b", "1")], bills.load(reg), NOW) == {}
    for broken in ("{broken", "[]", '{"read_at": 7}'):
        sql(reg, "UPDATE docs SET doc = ? WHERE name = 'bills'", (broken,))
        assert bills.load(reg) is None  # everything estimated


class Lagging(Billing):
    name = "runpod"
    billing_lag_s = 300.0


def rp_row(label: str, box_id: str, usd_h: float = 1.2, **kw: str) -> Row:
    return replace(row(label, box_id, usd_h), provider="runpod", **kw)


def test_spent_today_says_per_row_whether_a_bill_or_the_estimate_counted(
        tmp_path: Path) -> None:
    providers = {"vast": Billing({"1": 9.0, "stranger": 5.0}), "runpod": Lagging({"p": 20.0})}
    rows = [row("billed", "1"), row("unnamed", "2"),
            rp_row("pod", "p"),  # its bill ends five minutes ago: the price fills the lag
            replace(row("failed", "3"), status="failed"),
            replace(row("gone-yesterday", "4"), created_at="2026-12-02T01:00:00Z",
                    destroyed_at="2026-12-02T23:00:00Z", status="destroyed"),
            replace(row("gone-at-ten", "5"), destroyed_at="2026-12-03T10:00:00Z",
                    status="destroyed")]
    spent = bills.spent_today(rows, providers, NOW, registry=tmp_path / "boxes.json")
    by = {r.label: r for r in spent.rows}
    assert sorted(by) == ["billed", "gone-at-ten", "pod", "unnamed"]  # what ran today
    assert by["billed"].source == "bill" and by["billed"].usd == pytest.approx(9.0)
    assert by["pod"].source == "bill" and by["pod"].billed_usd == 20.0
    assert by["pod"].tail_usd == pytest.approx(1.2 * 300 / 3600)
    assert by["pod"].usd == pytest.approx(20.1)  # more than its price: the bill counts
    assert by["unnamed"].source == "estimate" and by["unnamed"].usd == pytest.approx(0.5 * 12)
    assert "not on vast's bill" in (by["unnamed"].why or "")
    assert by["gone-at-ten"].usd == pytest.approx(0.5 * 10) and not spent.errors
    assert spent.unnamed_usd == 5.0  # the stranger: a box no row names
    assert spent.total_usd == pytest.approx(9.0 + 20.0 + 0.1 + 6.0 + 5.0 + 5.0)
    # the budget counts the same money: the bills where they count, the estimate elsewhere
    day = budget.project(rows, 1000, now=NOW, billed=spent.billed())
    assert day.spent_usd == pytest.approx(spent.total_usd)
    assert spent.to_dict()["from_bills"] == 2


def test_a_provider_that_fails_or_answers_garbage_is_estimated_and_said() -> None:
    class Garbage(Billing):
        def charges(self, since: datetime, until: datetime) -> dict[str, float]:
            return {"1": "a lot"}  # type: ignore[dict-item]

    rows = [row("v", "1"), rp_row("pod", "p")]
    spent = bills.spent_today(rows, {"vast": Garbage({}), "runpod": Lagging(None)}, NOW)
    assert {r.label: r.source for r in spent.rows} == {"v": "estimate", "pod": "estimate"}
    assert "HTTP 503" in spent.errors["runpod"] and "unreadable" in spent.errors["vast"]
    pod = next(r for r in spent.rows if r.label == "pod")
    assert pod.usd == pytest.approx(1.2 * 12) and "HTTP 503" in (pod.why or "")
    assert spent.total_usd == pytest.approx(budget.project(rows, 100, now=NOW).spent_usd)


def test_the_saved_bills_round_trip_as_one_document(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    rows = [row("v", "1"), rp_row("pod", "p")]
    spent = bills.spent_today(rows, {"vast": Billing({"1": 3.0}), "runpod": Lagging(None)},
                              NOW, registry=reg)
    assert not (tmp_path / "bills.json").exists()
    ((doc,),) = sql(reg, "SELECT doc FROM docs WHERE name = 'bills'")
    saved = json.loads(doc)
    assert saved["read_at"] == "2026-12-03T12:00:00Z" and saved["since"] == "2026-12-03T00:00:00Z"
    assert saved["charges"] == {"vast": {"1": 3.0}} and list(saved["errors"]) == ["runpod"]
    assert saved["covered"] == {"vast": "2026-12-03T12:00:00Z"}
    assert bills.spent_from(rows, bills.load(reg), NOW) == spent  # the budget check's view


def test_a_bill_read_before_midnight_never_counts_after_it(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    before = datetime(2026, 12, 3, 23, 58, tzinfo=UTC)
    bills.refresh(reg, {"vast": Billing({"1": 9.0})}, before)
    after = before + timedelta(minutes=5)  # fresh, but yesterday's money
    (r,) = bills.spent_from([row("b", "1")], bills.load(reg), after).rows
    assert r.source == "estimate" and "another day" in (r.why or "")
    assert r.usd == pytest.approx(0.5 * 3 / 60)


@pytest.fixture
def sbx() -> Iterator[Sandbox]:
    with frozen_sandbox(seed=5) as s:
        yield s


def test_a_5xx_storm_on_the_fake_providers_is_estimated_then_the_bills_return(
        sbx: Sandbox, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k, v in sbx.env().items():
        monkeypatch.setenv(k, v)
    ps = {n: get_provider(n, retry=RetryPolicy(attempts=2), sleep=lambda s: None)
          for n in ("vast", "runpod")}
    rows = []
    for n, p in ps.items():
        box = p.rent(p.offers()[0], RentRequest(label=f"bill-{n}", image="img", disk_gb=20))
        rows.append(Row(label=box.label, provider=n, role="live", kind="standing",
                        card=box.card, gpu_count=1, usd_per_hour=box.usd_per_hour,
                        status="running", provider_id=box.box_id,
                        created_at=datetime.fromtimestamp(T0, UTC).isoformat()))
    sbx.world.advance(sbx.world.boot_delay)
    assert sbx.world.settle(30)
    sbx.world.advance(2 * 3600)
    now = datetime.fromtimestamp(sbx.world.now(), UTC)
    sbx.world.faults.add("server_error", "*", count=1000)
    storm = bills.spent_today(rows, ps, now, registry=tmp_path / "boxes.json")
    assert sorted(storm.errors) == ["runpod", "vast"]
    assert {r.source for r in storm.rows} == {"estimate"} and storm.total_usd > 0
    assert storm.total_usd == pytest.approx(budget.project(rows, 100, now=now).spent_usd)
    assert bills.billed(rows, bills.load(tmp_path / "boxes.json"), now) == {}
    sbx.world.faults.clear()
    calm = bills.spent_today(rows, ps, now, registry=tmp_path / "boxes.json")
    assert not calm.errors and {r.source for r in calm.rows} == {"bill"}
    meters = {c["id"]: c["gpu_usd"] + c["storage_usd"]
              for c in sbx.world.ledger.charges(T0, sbx.world.now(), sbx.world.now())}
    for r in calm.rows:  # the ledger's money (RunPod's last five minutes at the price)
        assert r.usd == pytest.approx(meters[next(x.provider_id for x in rows
                                                  if x.label == r.label)], rel=0.01)


def test_the_bills_refuse_through_the_budget_what_the_estimate_lets_through() -> None:
    rows = [row("b", "1")]  # $0.5/h: $6 spent by noon, $6 more until midnight
    # 6 + 6 + 6 for the new box; a day of both at their price is $24
    assert budget.project(rows, 25, 0.5, now=NOW).fits
    spent = bills.spent_today(rows, {"vast": Billing({"1": 15.0})}, NOW)
    day = budget.project(rows, 25, 0.5, now=NOW, billed=spent.billed())
    with pytest.raises(BudgetExceeded, match="spent today \\$15.00"):
        budget.require_fits(day, "renting a box")


def test_a_stopped_box_is_estimated_at_its_storage_price() -> None:
    r = replace(row("s", "1", usd_h=0.5), stopped_usd_per_hour=0.01,
                stopped_at="2026-12-03T04:00:00Z")
    assert bills.estimate(r, NOW) == pytest.approx(0.5 * 4 + 0.01 * 8)
    unknown = replace(r, stopped_usd_per_hour=None)  # no storage price: the full price
    assert bills.estimate(unknown, NOW) == pytest.approx(0.5 * 12)
    before = replace(r, stopped_at="2026-12-02T20:00:00Z", created_at="2026-12-02T00:00:00Z")
    assert bills.estimate(before, NOW) == pytest.approx(0.01 * 12)  # stopped since yesterday
    # a bill's tail after its covered end is priced the same way
    assert bills.priced(r, NOW - timedelta(hours=1), NOW) == pytest.approx(0.01)


@pytest.mark.parametrize("name", ["vast", "runpod"])
def test_the_estimate_of_a_box_stopped_on_the_fake_providers_matches_their_meter(
        sbx: Sandbox, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    for k, v in sbx.env().items():
        monkeypatch.setenv(k, v)
    p = get_provider(name, retry=RetryPolicy(attempts=2), sleep=lambda s: None)
    offer = p.offers()[0]
    req = RentRequest(label=f"stop-{name}", image="img", disk_gb=20)
    box = p.rent(offer, req)
    sbx.world.advance(sbx.world.boot_delay)
    assert sbx.world.settle(30)
    started = sbx.world.now()
    sbx.world.advance(3600)
    p.stop(box.box_id)
    assert sbx.world.settle(30)
    stopped = sbx.world.now()
    sbx.world.advance(3 * 3600)
    iso = lambda t: datetime.fromtimestamp(t, UTC).isoformat()  # noqa: E731
    r = Row(label=box.label, provider=name, role="live", kind="standing", card=box.card,
            gpu_count=1, usd_per_hour=p.box(box.box_id).usd_per_hour or box.usd_per_hour,
            status="running", provider_id=box.box_id, created_at=iso(T0),
            stopped_usd_per_hour=offer.stopped_usd_per_hour(req), stopped_at=iso(stopped))
    assert r.stopped_usd_per_hour is not None
    now = datetime.fromtimestamp(sbx.world.now(), UTC)
    meter = next(c for c in sbx.world.ledger.charges(T0, sbx.world.now(), sbx.world.now())
                 if c["id"] == box.box_id)
    # the meter ran from the boot, the estimate from the rent: a boot delay apart at most;
    # RunPod's price leaves out its running disk ($0.10/GB/month, about 1% here)
    metered = meter["gpu_usd"] + meter["storage_usd"]
    slack = box.usd_per_hour * (started - T0) / 3600
    assert abs(bills.estimate(r, now) - metered) <= slack + 0.02 * metered
    assert bills.estimate(r, now) < r.usd_per_hour * 4  # far below the full price


# --- a bill never counts for less than the price, and money no row names still counts -----

def test_a_lagging_bill_counts_no_less_than_the_price(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    # a $10/h box since midnight; at noon its bill says $110 (an hour behind, yet read as
    # current): the day so far cost $120 by its price
    bills.refresh(reg, {"vast": Billing({"1": 110.0})}, NOW)
    rows = [row("b", "1", usd_h=10.0)]
    (r,) = bills.spent_from(rows, bills.load(reg), NOW).rows
    assert r.source == "bill" and r.billed_usd == 110.0
    assert r.usd == pytest.approx(120.0) and r.estimate_usd == pytest.approx(120.0)
    spent = bills.billed(rows, bills.load(reg), NOW)
    assert spent == {"b": pytest.approx(120.0)}
    assert budget.project(rows, 1000, now=NOW, billed=spent).spent_usd == pytest.approx(120.0)
    # a caller's own figure below the estimate does not lower it either
    assert budget.project(rows, 1000, now=NOW, billed={"b": 50.0}).spent_usd == \
        pytest.approx(120.0)


def test_charges_no_row_names_and_failed_rows_on_the_bill_count(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    bills.refresh(reg, {"vast": Billing({"1": 9.0, "orphan": 5.0, "dup": 2.5, "3": 1.5})}, NOW)
    rows = [row("billed", "1"),
            replace(row("failed", "3"), status="failed", destroyed_at="2026-12-03T01:00:00Z"),
            replace(row("never", "4"), status="failed", destroyed_at="2026-12-03T01:00:00Z")]
    spent = bills.spent_from(rows, bills.load(reg), NOW)
    by = {r.label: r for r in spent.rows}
    assert sorted(by) == ["billed", "failed"]  # a failed row off the bill never billed
    assert by["failed"].usd == pytest.approx(1.5) and by["failed"].source == "bill"
    assert spent.unnamed == {"vast": {"orphan": 5.0, "dup": 2.5}}
    assert spent.unnamed_usd == pytest.approx(7.5)
    assert spent.total_usd == pytest.approx(9.0 + 1.5 + 7.5)
    assert spent.to_dict()["unnamed_usd"] == pytest.approx(7.5)
    billed = spent.billed()
    assert billed == {"billed": pytest.approx(9.0), "failed": pytest.approx(1.5)}
    assert billed.unnamed_usd == pytest.approx(7.5)
    day = budget.project(rows, 1000, now=NOW, billed=billed)
    assert day.spent_usd == pytest.approx(spent.total_usd)
    # the budget check's view counts it too
    assert bills.billed(rows, bills.load(reg), NOW).unnamed_usd == pytest.approx(7.5)
    with pytest.raises(BudgetExceeded, match="spent today \\$18.00"):
        budget.guard(18.0 + 6.0 + 0.5 * 12 - 1, 0.5, "renting a box",
                     bills=bills.load(reg), now=NOW, account=())(rows)


def test_charges_no_row_names_count_when_no_row_is_on_the_bill(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    bills.refresh(reg, {"vast": Billing({"stranger": 95.0})}, NOW)
    rows = [row("new", "1", usd_h=0.01)]  # not on the bill: estimated
    billed = bills.billed(rows, bills.load(reg), NOW)
    assert billed == {} and billed.unnamed_usd == pytest.approx(95.0)
    day = budget.project(rows, 100, now=NOW, billed=billed)
    assert day.spent_usd == pytest.approx(95.0 + 0.01 * 12)
    assert budget.today(rows, 100, NOW, billed).to_dict()["spent_today_usd"] == \
        pytest.approx(95.0 + 0.01 * 12)
    with pytest.raises(BudgetExceeded, match="spent today \\$95.12"):
        budget.guard(100, 0.5, "renting a box", bills=bills.load(reg), now=NOW,
                     account=())(rows)
