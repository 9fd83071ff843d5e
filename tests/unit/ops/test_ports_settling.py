"""Owed ports judged on settled evidence: a box the peers deploy skipped gets its file once it
answers, the settle gate counts from the readings, a blind tick gives no move up, a mate that
dials no one proves no mapping undialable, and a port move ends only on its own terms."""

from __future__ import annotations

import time
import types
from dataclasses import replace
from typing import Any

import pytest
from test_ports import blank_ports, porting_loop, portless_market, replacing, standing
from test_spread import rent_standing, wait_running

from fleet.core.verdicts import Health
from fleet.ops import loop as loop_mod
from fleet.ops import ports
from fleet.ops.loop import Loop
from fleet.ops.loop import moves as loop_moves
from fleet.state.loop_memory import Memory
from sandbox.control_client import ControlClient
from sandbox.daemon import Sandbox


def well(label: str, peers_in: int | None = 2, **kw: Any) -> Health:
    return Health(label, "vast", ssh=True, agent=True, synced=True, peers_in=peers_in, **kw)


# -- C1: a peers deploy that skipped a box is recorded as written on it -------------------------


def test_a_box_skipped_by_the_peers_deploy_gets_its_file_once_it_answers(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The role's endpoints change (a box joins, a mapping moves) on a tick where one box's SSH
    does not answer (one missed check, far from dead). `_peers` deploys on the others only
    (`skip`) but records the new set as written for the whole role (`mem.peers[role] = sig`).
    The box answers again next tick: the set is 'unchanged', so its peers file is never
    rewritten. Its node never dials the new endpoint, and once SETTLE_S has passed the loop
    reads that missing dial (its own failed deploy) as the mapping's verdict."""
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    calls: list[list[str]] = []
    lp.peers_fn = lambda _c, labels: calls.append(list(labels))  # type: ignore[assignment,misc,func-returns-value]
    a, b, c = (rent_standing(lp.cfg, lp.reg, f"live-k-{x * 6}") for x in "abc")
    wait_running(sbx)
    standing(lp, a, b, c)
    lp.tick()
    assert calls == [[a.label, b.label, c.label]]
    mem = Memory.load(lp.cfg.registry)  # the endpoints changed since they were last written
    mem.peers["live"] = "an older set"
    mem.save(lp.cfg.registry)
    verdicts[c.label] = Health(c.label, "vast", problems=["ssh: box did not answer"])
    t = lp.tick()
    assert calls[-1] == [a.label, b.label], t.actions
    verdicts.pop(c.label)
    t = lp.tick()  # c answers again: its peers file still holds the older set
    assert any(c.label in call for call in calls[1:]), (
        f"{c.label}'s peers file was never rewritten with the new endpoints", calls, t.actions)


# -- C2: SETTLE_S measured at the moves, not at the readings ------------------------------------


def test_the_settle_gate_counts_from_the_readings_not_from_a_slow_tick_s_end(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The peers files were written 30 s before this tick's checks: the readings the checks
    took (up to 45 s old on the box) may predate them, so no mate dialling a box tells nothing
    yet. But `_start_moves` measures the peers files' age with the clock of its own call:
    when the tick spent 40 s between its checks and its moves (`_rent_owed`'s rent and SSH
    wait for another role, `_finish_moves`' destroys), the same stale readings pass the gate
    and a replacement is rented."""
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    a = rent_standing(lp.cfg, lp.reg, "live-g-aaaaaa")
    b = rent_standing(lp.cfg, lp.reg, "live-g-bbbbbb")
    wait_running(sbx)
    standing(lp, a, b)
    verdicts[a.label] = well(a.label, peers_in=0, star_only=True)
    lp.tick()  # the peers files written at its end
    mem = Memory.load(lp.cfg.registry)
    mem.peers_at = {"live": _iso(time.time() - 30)}
    mem.save(lp.cfg.registry)
    real = Loop._rent_owed

    def slow(self: Loop, t: Any, m: Any) -> list[str]:
        out = real(self, t, m)
        clock = types.SimpleNamespace(time=lambda: time.time() + 40, monotonic=time.monotonic,
                                      sleep=time.sleep)
        for phase in (loop_mod, loop_moves):  # 40 s spent renting another role's box
            monkeypatch.setattr(phase, "time", clock)
        return out

    monkeypatch.setattr(Loop, "_rent_owed", slow)
    t = lp.tick()
    movers = [r.label for r in lp.reg.rows() if r.move_of == a.label]
    assert movers == [], ("a replacement rented on readings taken 30 s after the peers files "
                          "were written", t.owed_ports, t.actions)


def _iso(epoch: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- C3: a move abandoned on a tick that judged nothing -----------------------------------------


def test_a_move_past_its_deadline_is_not_given_up_on_a_blind_tick(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The port replacement is well and synced, its mates start dialling it just as its
    move_timeout_s passes, and that tick the fleet is blind (its SSH key unreadable, or the
    breaker open): no check at all. `_finish_moves` reads 'not done' from the missing check
    and destroys the new node, synced and dialled; the portless old box stays. The deadline
    should be judged only on a tick that read the new box."""
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    old, new = replacing(sbx, lp, "live-t-oooooo")
    verdicts[new.label] = well(new.label, peers_in=0)  # synced, not dialled yet
    t = lp.tick()
    assert lp.reg.get(old.label).live and lp.reg.get(new.label).live, t.actions  # type: ignore[union-attr]
    cfg = lp.cfg
    lp.cfg = replace(cfg, ssh_key=tmp_path / "gone",  # the fleet's own SSH key unreadable
                     loop=replace(cfg.loop, move_timeout_s=0.0))
    t = lp.tick()
    assert lp.reg.get(new.label).live, (  # type: ignore[union-attr]
        "the new node was given up on a tick that read nothing", t.actions)


# -- C4: a mate that dials no one blames its mate's mapping -------------------------------------


def test_a_mate_that_dials_no_one_does_not_make_a_mapping_undialable() -> None:
    """A role of two: a's egress is broken (it dials no one, peers_out 0), b dials a. b reads
    0 inbound, star-only, and its one mate is dialled (by b itself): b is judged owed a port,
    though nothing ever tried to dial it. Each replacement then needs a's dial too (`_ported`:
    min(2, mates)), never gets it, and bills until move_timeout_s (6 h), MOVE_TRIES times."""
    data = {"p2p_port": 26611, "public_ip": "10.77.1.2", "p2p_public_port": 40001,
            "provider": "vast", "role": "live"}
    b = Health("b", "vast", ssh=True, agent=True, peers_in=0, peers_out=1, star_only=True)
    a = Health("a", "vast", ssh=True, agent=True, peers_in=1, peers_out=0, star_only=False)
    assert ports.owed(data, b, [a], True) is None, ports.owed(data, b, [a], True)


# -- C5: a port move outlives the verdict that started it ---------------------------------------


def test_a_port_move_is_not_finished_once_the_old_box_owes_no_port(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A box whose mapping Vast lists late (ports null past one interval after conversion, an
    API gap) is judged 'no mapped p2p port' and a replacement is rented at once (no SETTLE_S
    for this verdict). The next listing maps the port and every mate dials the old box: it
    owes nothing any more. The move runs on regardless and destroys the old node, synced and
    dialled, for the new one: the fleet's transient blindness decided a destroy."""
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    mate = rent_standing(lp.cfg, lp.reg, "live-l-mmmmmm")
    old = rent_standing(lp.cfg, lp.reg, "live-l-oooooo")
    wait_running(sbx)
    standing(lp, mate, old)
    mapped = lp.reg.get(old.label).p2p_public_port  # type: ignore[union-attr]
    assert mapped
    lp.reg.update(old.label, p2p_public_port=None)  # never listed yet
    switch = blank_ports(lp, {old.provider_id or ""})
    t = lp.tick()
    new = next((r for r in lp.reg.rows() if r.move_of == old.label), None)
    assert new is not None, t.actions  # the verdict on the listing's gap (as designed)
    switch["on"] = False  # the listing catches up: the old box maps its port, dialled
    wait_running(sbx)
    lp.reg.update(new.label, standing=True)
    t = lp.tick()  # the new box is well, synced and dialled; so is the old one, mapped
    assert lp.reg.get(old.label).p2p_public_port == mapped  # type: ignore[union-attr]
    assert old.label not in t.owed_ports
    assert lp.reg.get(old.label).live, (  # type: ignore[union-attr]
        "the old box was destroyed by a move for a port it no longer owed", t.actions)


# -- C6: MOVE_TRIES shared by place and port moves ----------------------------------------------


def test_ended_place_moves_do_not_use_up_a_box_s_port_replacements(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three moves of a crowded box ended (each landed crowded): `_move` counts every ended
    move of the box, place or port, against MOVE_TRIES. When the box is later owed a port and
    an offer maps one, it 'stays: 3 replacements ended without one' forever, though no
    replacement for a port was ever tried."""
    lp = porting_loop(tmp_path, monkeypatch, {})
    machines = portless_market(sbx, lp.cfg)
    old = rent_standing(lp.cfg, lp.reg, "live-m-oooooo")
    wait_running(sbx)
    standing(lp, old)
    for i in range(3):  # three ended place moves, as the registry keeps them
        lp.reg.add(replace(old, label=f"{old.label}-r{i + 1}", provider_id=f"gone{i}",
                           status="destroyed", move_of=old.label, move_for="place",
                           note="move given up: it landed crowded"))
    with ControlClient(sbx.control.url) as c:
        c.shape_machine("vast", machines[-1]["machine_id"], direct_port_count=100)
    t = lp.tick()
    movers = [r for r in lp.reg.rows() if r.move_of == old.label and r.live]
    assert movers, ("no port replacement tried after three ended place moves", t.actions)


