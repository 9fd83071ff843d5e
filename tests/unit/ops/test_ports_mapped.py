"""Owed ports never cost a box that maps its port: a listing without ports, a replacement
listed before its ports, a restart that remaps the port, and port or place moves rent no
replacement it is not owed and never trade it for a portless box or the same host."""

from __future__ import annotations

from typing import Any

import pytest
from test_ports import blank_ports, peers_settled, porting_loop, replacing, standing
from test_spread import offer_free_place, rent_standing, vast_machines, wait_running

from fleet.core.verdicts import Health
from sandbox.control_client import ControlClient
from sandbox.daemon import Sandbox


def test_one_running_listing_without_ports_rents_no_replacement_of_a_mapped_box(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A box that maps its p2p port, healthy and dialled, is listed once by Vast as running
    with its SSH on the proxy and `ports` null. The mapping is cleared from the row at once
    (Box.p2p_endpoint trusts 'ssh_ready' as 'listed whole'), the box judged owed a port and a
    replacement rented in that same tick; the move then runs to the end and destroys the
    healthy box, though the next listing maps the port again."""
    lp = porting_loop(tmp_path, monkeypatch, {})
    mate = rent_standing(lp.cfg, lp.reg, "live-x-mmmmmm")
    old = rent_standing(lp.cfg, lp.reg, "live-x-oooooo")
    wait_running(sbx)
    standing(lp, mate, old)
    mapped = lp.reg.get(old.label).p2p_public_port  # type: ignore[union-attr]
    assert mapped
    t = lp.tick()
    assert t.owed_ports == {}, t.actions
    switch = blank_ports(lp, {old.provider_id or ""})
    t = lp.tick()  # one incomplete listing
    switch["on"] = False
    movers = [r.label for r in lp.reg.rows() if r.move_of == old.label]
    assert movers == [], ("a replacement was rented on one incomplete listing", t.actions)
    assert lp.reg.get(old.label).p2p_public_port == mapped  # type: ignore[union-attr]


def test_a_port_replacement_listed_before_its_ports_appear_is_not_given_up(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The replacement rented for a port is listed running (proxy SSH) before Vast lists its
    `ports`: `_finish_moves` reads 'no mapped' and destroys it on the spot ('owed a port
    too'), burning one of the MOVE_TRIES, instead of waiting (`_ported` already has a 'no
    mapped p2p port listed yet' wait, never reached)."""
    lp = porting_loop(tmp_path, monkeypatch, {})
    old, new = replacing(sbx, lp, "live-y-oooooo")  # the old box on a host that maps none
    switch = blank_ports(lp, {new.provider_id or ""})
    t = lp.tick()  # the new box is running, its ports not listed yet
    switch["on"] = False
    assert lp.reg.get(new.label).live, "\n".join(t.actions)  # type: ignore[union-attr]


def test_a_restart_that_remaps_the_port_rents_no_replacement_before_the_peers_follow(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A box restarts and its provider maps the p2p port anew. On that tick its mates still
    dial the old endpoint (their peers files are rewritten by `_peers`, at the END of the
    tick), so the box reads 0 inbound, star-only, while its mates are dialled: it is judged
    owed a port and `_start_moves` rents a replacement in the same tick, before the peers
    files that would make it dialable are even written. The fleet's own lag is read as a
    verdict on the box's mapping."""
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    a = rent_standing(lp.cfg, lp.reg, "live-z-aaaaaa")
    b = rent_standing(lp.cfg, lp.reg, "live-z-bbbbbb")
    c = rent_standing(lp.cfg, lp.reg, "live-z-cccccc")
    wait_running(sbx)
    standing(lp, a, b, c)
    t = lp.tick()
    assert t.owed_ports == {}, t.actions
    now = lp.reg.get(a.label).p2p_public_port  # type: ignore[union-attr]
    lp.reg.update(a.label, p2p_public_port=(now or 0) + 1)  # the mapping before the restart
    # ... and the peers files as the last tick wrote them: with that old mapping
    from fleet.ops.loop.base import peers_sig
    from fleet.state.loop_memory import Memory
    mem = Memory.load(lp.cfg.registry)
    mem.peers["live"] = peers_sig(lp._by_role()["live"])
    mem.save(lp.cfg.registry)
    verdicts[a.label] = Health(a.label, "vast", ssh=True, agent=True, synced=True,
                               peers_in=0, star_only=True,
                               problems=["node: star-only"])
    t = lp.tick()
    assert lp.reg.get(a.label).p2p_public_port == now  # the tick saw the new mapping
    movers = [r.label for r in lp.reg.rows() if r.move_of == a.label]
    assert movers == [], ("replacement rented on the tick the mapping changed", t.actions)


def test_a_port_move_for_an_undialable_mapping_does_not_land_on_the_same_host(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old box's host maps the port, but no mate can dial it (the host's NAT or
    firewall): the box is owed a port. `_move` for a port passes over only the places of
    earlier moves that ended (`spent`), never the old box's own place: where no free place
    maps a port, the replacement is rented on the very host whose mapping is undialable,
    and waits out move_timeout_s before it is given up."""
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    machines = vast_machines(sbx, lp.cfg)
    cheap = next(m for m in machines if m["free_gpus"] >= 2)
    with ControlClient(sbx.control.url) as ctl:
        ctl.shape_machine("vast", cheap["machine_id"], price_per_gpu=0.01)
    old = rent_standing(lp.cfg, lp.reg, "live-w-oooooo")
    assert old.place == f"vast machine {cheap['machine_id']}"
    mate = rent_standing(lp.cfg, lp.reg, "live-w-mmmmmm")
    with ControlClient(sbx.control.url) as ctl:  # every other host maps no port
        for m in machines:
            if f"vast machine {m['machine_id']}" not in (old.place, mate.place):
                ctl.shape_machine("vast", m["machine_id"], direct_port_count=1)
    wait_running(sbx)
    standing(lp, old, mate)
    verdicts[old.label] = Health(old.label, "vast", ssh=True, agent=True, synced=True,
                                 peers_in=0, star_only=True, problems=["node: star-only"])
    t = lp.tick()  # the mates' peers files are written at this tick's end: no verdict yet
    assert old.label not in t.owed_ports, t.actions
    peers_settled(lp)
    t = lp.tick()
    assert old.label in t.owed_ports, t.actions
    new = next((r for r in lp.reg.rows() if r.move_of == old.label), None)
    assert new is None or new.place != old.place, (
        f"replacement {new.label} rented on {new.place}, the old box's own undialable host",
        t.actions)


def test_a_place_move_does_not_trade_a_mapped_box_for_a_portless_one(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spread move's new box (rented from an offer that mapped the port) is listed without
    the mapping (its host's direct ports went before it came up). The place branch of
    `_finish_moves` never looks at the port: the crowded box, which maps one and is dialled,
    is destroyed for a box the same tick's check judges owed a port."""
    from test_spread import crowd

    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    machines = vast_machines(sbx, lp.cfg)
    cheap = crowd(sbx, machines, keep=0)
    a = rent_standing(lp.cfg, lp.reg, "live-v-aaaaaa")
    b = rent_standing(lp.cfg, lp.reg, "live-v-bbbbbb")
    wait_running(sbx)
    standing(lp, a, b)
    assert lp.reg.get(b.label).p2p_public_port  # type: ignore[union-attr]
    free = offer_free_place(sbx, machines, cheap)
    t = lp.tick()
    mover = next((r for r in lp.reg.rows() if r.move_of == b.label), None)
    assert mover is not None and mover.move_for == "place", t.actions
    with ControlClient(sbx.control.url) as c:  # its host's ports go before it is up
        c.shape_machine("vast", free["machine_id"], direct_port_count=0)
    wait_running(sbx)
    lp.reg.update(mover.label, standing=True)
    t = lp.tick()
    assert lp.reg.get(b.label).live, (  # type: ignore[union-attr]
        "the mapped, dialled box was destroyed for a portless mover", "\n".join(t.actions),
        t.owed_ports)
