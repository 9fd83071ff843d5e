"""The spread's moves and offers at their edges: one move after another, a mover and its crowded
box dying together, a mover given up or landing on a held place, a mover that never syncs, a
free place over the budget, RunPod's per-data-center query refused, an unplaced offer against a
free data center."""
from __future__ import annotations

from typing import Any

import pytest
from test_spread import client, crowd, moving_loop, rent_standing, vast_machines, wait_running

from fleet.boxes import lifecycle
from fleet.core import config
from fleet.core.errors import ProviderError
from fleet.core.verdicts import Health
from fleet.ops import loop as loop_mod
from fleet.ops import spread
from fleet.providers.base import Offer
from sandbox.control_client import ControlClient


def setup(sbx, tmp_path, monkeypatch, n, verdicts=None, free=1):
    verdicts = {} if verdicts is None else verdicts
    lp = moving_loop(tmp_path, sbx, monkeypatch, verdicts)
    machines = vast_machines(sbx, lp.cfg)
    cheap = crowd(sbx, machines, keep=0)
    monkeypatch.setattr(loop_mod.rent_mod, "wait_ready", lambda _c, reg, _p, labels: {
        label: lifecycle.pin(reg, reg.get(label), "ssh-ed25519 AAAA") for label in labels})
    rows = [rent_standing(lp.cfg, lp.reg, f"live-m-{c * 6}") for c in "abcdef"[:n]]
    wait_running(sbx)
    for r in rows:
        lp.reg.update(r.label, host_key="ssh-ed25519 AAAA", standing=True)
        lifecycle.record(lp.reg, r.label, client("vast").box(r.provider_id or ""))
    tier = next(m["datacenter"] for m in machines if m["machine_id"] == cheap)
    frees = [m for m in machines if m["machine_id"] != cheap and m["datacenter"] == tier][:free]
    with ControlClient(sbx.control.url) as c:
        for m in frees:
            c.shape_machine("vast", m["machine_id"], other_tenants=0)
    return lp, rows, cheap, frees, verdicts


def live(lp):
    return sorted(r.label for r in lp.reg.rows() if r.live)


def test_after_one_finished_move_the_next_crowded_box_still_moves(sbx, tmp_path, monkeypatch):
    """Promise 2: three boxes on one machine, two free machines offered. The first move
    finishes (b destroyed); c still shares a's machine and must move too."""
    lp, (a, b, c), cheap, frees, _ = setup(sbx, tmp_path, monkeypatch, 3, free=2)
    lp.tick()
    m1 = next(r for r in lp.reg.rows() if r.move_of == b.label)
    wait_running(sbx)
    lp.reg.update(m1.label, standing=True)
    lp.tick()  # m1 checked well and synced: b destroyed
    assert not lp.reg.get(b.label).live
    assert [r.label for r in spread.crowded(lp.reg.rows(), lp.cfg.role("live"))] == [c.label]
    for _ in range(3):
        t = lp.tick()
    assert any(r.move_of == c.label for r in lp.reg.rows()), (
        "c shares a's machine, a free machine is offered, no move runs; yet no move starts: "
        f"{t.actions}")


def test_mover_and_crowded_box_dying_in_one_tick_owe_one_rerent_not_two(
        sbx, tmp_path, monkeypatch):
    """Promise 4: a + b share a machine, m moves b. The provider stops both b and m in the
    same tick: the role lost one box (b+m counted one), so exactly one re-rent. (Two of the
    provider's three boxes gone at once, unconfirmed, would trip its breaker instead.)"""
    lp, (a, b), cheap, frees, _ = setup(sbx, tmp_path, monkeypatch, 2, free=3)
    lp.tick()
    m = next(r for r in lp.reg.rows() if r.move_of == b.label)
    wait_running(sbx)
    lp.reg.update(m.label, standing=True)
    # the mover is up but not yet synced, and the provider stops both it and b (outbid)
    with ControlClient(sbx.control.url) as c:
        c.fault("preempt", target=b.label)
        c.fault("preempt", target=m.label)
    for _ in range(lp.cfg.loop.dead_checks + 1):
        t = lp.tick()
    alive = live(lp)
    assert len(alive) == 2, f"the role had 2 boxes; now {alive}; actions {t.actions}"


def test_a_mover_given_up_is_not_rented_again_and_again_on_the_same_machine(
        sbx, tmp_path, monkeypatch):
    """Promise 4 (no churn): the one free machine's boxes never become SSH-ready. Each mover
    is given up at ready_timeout_s and destroyed; the loop rents the next mover on the very
    same machine, forever, while b (synced) is fine."""
    lp, (a, b), cheap, frees, _ = setup(sbx, tmp_path, monkeypatch, 2, free=1)
    real = lifecycle.host_key_if_ready
    monkeypatch.setattr(lifecycle, "host_key_if_ready",
                        lambda box: None if "-r" in (box.label or "") else real(box))
    monkeypatch.setattr(loop_mod.rent_mod, "wait_ready", lambda *a, **k: {})
    for _ in range(4):
        lp.tick()  # rents a mover (or gives the last one up)
        wait_running(sbx)
        for r in lp.reg.rows():  # its ready deadline passed
            if r.live and r.move_of:
                lp.reg.update(r.label, created_at="2000-01-01T00:00:00Z")
        lp.tick()
    movers = [r for r in lp.reg.rows() if r.move_of == b.label]
    places = [r.place for r in movers]
    assert len(movers) <= 2, (f"{len(movers)} movers rented and given up on {set(places)}: "
                              f"{[(r.label, r.status, (r.note or '')[:60]) for r in movers]}")


def test_a_mover_that_landed_on_a_taken_place_does_not_destroy_the_crowded_box(
        sbx, tmp_path, monkeypatch):
    """A RunPod pod may land in a data center other than asked (the brief's case); here the
    provider lists the mover on a's machine. The move gained no spread, yet b (synced) is
    destroyed and the mover is now the crowded box."""
    import dataclasses
    lp, (a, b), cheap, frees, _ = setup(sbx, tmp_path, monkeypatch, 2, free=1)
    lp.tick()
    m = next(r for r in lp.reg.rows() if r.move_of == b.label)
    vast = lp.providers["vast"]
    real_boxes, real_box = vast.boxes, vast.box

    def moved(bx):
        return dataclasses.replace(bx, machine_id=cheap) if bx and bx.label == m.label else bx
    monkeypatch.setattr(vast, "boxes", lambda *a, **k: [moved(x) for x in real_boxes(*a, **k)])
    monkeypatch.setattr(vast, "box", lambda i: moved(real_box(i)))
    wait_running(sbx)
    lp.reg.update(m.label, standing=True)
    t = lp.tick()
    assert lp.reg.get(m.label).place == f"vast machine {cheap}"  # synced from the listing
    assert lp.reg.get(b.label).live, f"b destroyed for a move that gained nothing: {t.actions}"


def test_a_mover_that_never_syncs_keeps_both_boxes_billing_without_end(
        sbx, tmp_path, monkeypatch):
    """No deadline on a move: a mover that never becomes well (its node never syncs on the new
    machine) runs beside the crowded box forever, both billed, and blocks every other move
    of the role."""
    verdicts: dict[str, Any] = {}
    lp, (a, b), cheap, frees, verdicts = setup(sbx, tmp_path, monkeypatch, 2, verdicts, free=1)
    lp.tick()
    m = next(r for r in lp.reg.rows() if r.move_of == b.label)
    wait_running(sbx)
    lp.reg.update(m.label, standing=True, created_at="2000-01-01T00:00:00Z")
    verdicts[m.label] = Health(m.label, "vast", ssh=True, agent=True, synced=False,
                               problems=["node: not synced"])
    for _ in range(5):
        t = lp.tick()
    assert not (lp.reg.get(b.label).live and lp.reg.get(m.label).live), (
        f"years on, both still run: {t.actions}")


def test_held_crowded_box_dying_mid_move_leaves_the_count(sbx, tmp_path, monkeypatch):
    lp, (a, b), cheap, frees, _ = setup(sbx, tmp_path, monkeypatch, 2, free=3)
    lp.tick()
    m = next(r for r in lp.reg.rows() if r.move_of == b.label)
    wait_running(sbx)
    lp.reg.update(m.label, standing=True)
    client("vast").destroy(b.provider_id)
    for _ in range(lp.cfg.loop.dead_checks + 2):
        t = lp.tick()
    assert live(lp) == sorted([a.label, m.label]), t.actions


def test_held_mover_dying_mid_move_owes_nothing(sbx, tmp_path, monkeypatch):
    verdicts: dict[str, Any] = {}
    lp, (a, b), cheap, frees, verdicts = setup(sbx, tmp_path, monkeypatch, 2, verdicts, free=3)
    lp.tick()
    m = next(r for r in lp.reg.rows() if r.move_of == b.label)
    wait_running(sbx)
    lp.reg.update(m.label, standing=True)
    client("vast").destroy(lp.reg.get(m.label).provider_id)
    verdicts[m.label] = Health(m.label, "vast", ssh=False, agent=False)  # gone, and no SSH
    for _ in range(lp.cfg.loop.dead_checks):
        t = lp.tick()
    rows = lp.reg.rows()
    assert not lp.reg.get(m.label).live
    # a and b, plus at most one new mover for b: never a re-rent of m
    assert all(r.rerent_of is None for r in rows), t.actions
    assert len([r for r in rows if r.live and not r.move_of]) == 2


def test_held_provider_failing_in_the_finishing_tick_destroys_nothing(sbx, tmp_path, monkeypatch):
    lp, (a, b), cheap, frees, _ = setup(sbx, tmp_path, monkeypatch, 2, free=1)
    lp.tick()
    m = next(r for r in lp.reg.rows() if r.move_of == b.label)
    wait_running(sbx)
    lp.reg.update(m.label, standing=True)
    vast = lp.providers["vast"]
    real = vast.boxes

    def boom(*a, **k):
        from fleet.core.errors import ProviderError
        raise ProviderError("vast", "instances", "HTTP 502")
    monkeypatch.setattr(vast, "boxes", boom)
    lp.tick()
    assert lp.reg.get(b.label).live
    monkeypatch.setattr(vast, "boxes", real)
    lp.tick()
    assert not lp.reg.get(b.label).live


def test_a_free_place_over_budget_stops_the_rent_though_a_shared_place_fits(
        sbx, tmp_path, monkeypatch):
    """rent() tries free places first; the budget check of an offer raises out of rent() (it
    is not `continue`d like OfferGone), so a pricier free-place offer that breaks the budget
    leaves the role with no box at all, though the cheap shared-place offer fits. Before the
    change offers were cheapest first, so the first over budget meant all were."""
    import dataclasses

    from test_spread import make_cfg

    from fleet.core.errors import BudgetExceeded
    from fleet.state.registry import Registry
    cfg = dataclasses.replace(make_cfg(tmp_path), daily_budget_usd=10.0)
    machines = vast_machines(sbx, cfg)
    cheap = crowd(sbx, machines, keep=0)
    tier = next(m["datacenter"] for m in machines if m["machine_id"] == cheap)
    pricey = next(m for m in machines if m["machine_id"] != cheap and m["datacenter"] == tier)
    with ControlClient(sbx.control.url) as c:
        c.shape_machine("vast", pricey["machine_id"], other_tenants=0, price_per_gpu=5.0)
    reg = Registry(cfg.registry)
    rent_standing(cfg, reg, "live-b-aaaaaa")  # $0.05/h: $1.20 a day
    try:
        row = rent_standing(cfg, reg, "live-b-bbbbbb")  # the $0.05/h shared place fits
    except BudgetExceeded as e:
        pytest.fail(f"no box rented, though the shared place fits the budget: {e}")
    assert row.place == f"vast machine {cheap}" and row.note


def test_a_failing_per_data_center_query_costs_every_runpod_offer(sbx, monkeypatch):
    """The second query (one aliased lowestPrice per data center, for every type in stock: with
    no card ~40 types x ~30 centres) is new; if RunPod refuses it (complexity, a schema
    mismatch, a 5xx), offers() raises and even Community offers and the aggregate Secure
    offers that worked before the change are lost, for `fleet offers`, rents and re-rents."""
    rp = client("runpod")
    assert rp.offers(card="RTX 4090")
    real = rp._gql

    def gql(call, doc):
        if "dc0:" in doc:
            raise ProviderError("runpod", call, "query too complex")
        return real(call, doc)
    monkeypatch.setattr(rp, "_gql", gql)
    try:
        found = rp.offers(card="RTX 4090")
    except ProviderError as e:
        pytest.fail(f"every RunPod offer lost to the per-data-center query: {e}")
    assert any(o.cloud == "COMMUNITY" for o in found)


def test_a_cheaper_offer_that_names_no_place_beats_a_free_data_center():
    """Promise 1: 'distinct data centers wherever an offer on a free place exists'. With a
    Community offer cheaper than a Secure offer on a free data center, every box goes to
    Community, where the spread sees nothing (two boxes may share a host) and never moves."""
    role = config.Role("live", "standing", "img", 20)
    held = {"runpod data center EU-RO-1": ["live-a"]}
    community = Offer("runpod", "t:COMMUNITY", "RTX 4090", 1, 0.30, cloud="COMMUNITY")
    free_dc = Offer("runpod", "t:SECURE:US-TX-3", "RTX 4090", 1, 0.50, cloud="SECURE",
                    data_center="US-TX-3")
    first = spread.order(role, [community, free_dc], held)[0]
    assert first is free_dc, "the unplaced Community offer is tried before the free DC"
