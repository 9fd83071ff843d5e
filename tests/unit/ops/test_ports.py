"""Owed ports (`fleet.ops.ports`): a standing box of a p2p role that no mate can dial is
replaced by one from an offer that maps the port, within the budget, and kept until the new
node is checked well, synced and dialled. Against the sandbox's real Vast API (in-process, on
loopback); tests/integration/test_ports_sandbox.py does the same with real boxes and nodes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_spread import client, make_cfg, rent_standing, vast_machines, wait_running

from fleet.boxes import lifecycle
from fleet.core.boxes import Row
from fleet.core.config import Config
from fleet.core.errors import ProviderError
from fleet.core.verdicts import Health
from fleet.ops import loop as loop_mod
from fleet.ops import offers as offers_mod
from fleet.ops import ports
from fleet.ops.loop import Loop
from fleet.providers.base import Box
from fleet.state.registry import Registry
from sandbox.control_client import ControlClient
from sandbox.daemon import Sandbox


def portless_market(sbx: Sandbox, cfg: Config, *but: Row) -> list[dict[str, Any]]:
    """Every admissible Vast RTX 4090 host (but those of the rows `but`) with one direct port
    only: too few for the direct SSH and the p2p port, so a box there maps neither. Returns
    those hosts, cheapest first."""
    kept = {r.place for r in but}
    machines = [m for m in vast_machines(sbx, cfg)
                if f"vast machine {m['machine_id']}" not in kept]
    with ControlClient(sbx.control.url) as c:
        for m in machines:
            c.shape_machine("vast", m["machine_id"], direct_port_count=1)
    return machines


def full(sbx: Sandbox, row: Row) -> None:
    """Other tenants take what `row`'s host has free: nothing more is offered there."""
    assert row.place is not None
    host = row.place.removeprefix("vast machine ")
    with ControlClient(sbx.control.url) as c:
        free = next(m["free_gpus"] for m in c.machines() if m["machine_id"] == host)
        c.shape_machine("vast", host, other_tenants=free)


# -- offers and the rent's row ----------------------------------------------------------------


def test_a_p2p_role_is_offered_hosts_that_map_both_its_ports_first(
        sbx: Sandbox, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    assert ports.direct(cfg.role("live")) == 2  # the direct SSH takes a direct port too
    found, _ = offers_mod.search(cfg.role("live"), [client("vast")], card="RTX 4090")
    assert found and all((o.direct_ports or 0) >= 2 and not o.portless for o in found)


def test_with_no_offer_that_maps_a_port_the_box_is_rented_portless_and_its_row_says_so(
        sbx: Sandbox, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    portless_market(sbx, cfg)
    found, failures = offers_mod.search(cfg.role("live"), [client("vast")], card="RTX 4090")
    assert found and not failures and all(o.portless for o in found)
    none, _ = offers_mod.search(cfg.role("live"), [client("vast")], card="RTX 4090",
                                portless=False)
    assert none == []
    row = rent_standing(cfg, Registry(cfg.registry), "live-p-aaaaaa")
    assert row.note == ("owed a port: no offer mapped the p2p port 26611 when it was rented; "
                        "the loop replaces it once one does")
    wait_running(sbx)
    box = client("vast").box(row.provider_id or "")
    assert box is not None and box.ssh_ready and box.p2p_public_port is None


def test_no_portless_offer_is_taken_while_a_provider_did_not_answer(tmp_path: Path) -> None:
    """A provider that failed the search may offer a port: nothing portless is offered."""
    cfg = make_cfg(tmp_path)

    class Failing:
        name = "runpod"

        def offers(self, **_: Any) -> list[Any]:
            raise ProviderError("runpod", "offers", "HTTP 500")

    class Portless:
        name = "vast"
        asked: list[int] = []

        def offers(self, direct_ports: int, **_: Any) -> list[Any]:
            self.asked.append(direct_ports)
            return []

    v = Portless()
    found, failures = offers_mod.search(cfg.role("live"), [Failing(), v])  # type: ignore[list-item]
    assert found == [] and len(failures) == 1 and v.asked == [2]


# -- the rule ---------------------------------------------------------------------------------


def data(port: int | None, ip: str | None = "10.77.1.2") -> dict[str, Any]:
    return {"p2p_port": 26611, "public_ip": ip, "p2p_public_port": port, "provider": "vast",
            "role": "live"}


def test_a_box_without_a_mapping_is_owed_a_port_whatever_its_peers() -> None:
    h = Health("a", "vast", ssh=True, agent=True, peers_in=3)
    assert ports.owed(data(None), h, [], True) == (
        "no mapped p2p port: vast lists no public mapping of port 26611")
    assert ports.owed(data(40001, ip=None), h, [], True) is not None
    assert ports.owed({**data(None), "p2p_port": None}, h, [], True) is None  # no p2p role
    assert ports.owed(data(None), h, [], False) is None  # a mapping may be listed late


def test_a_mapping_no_mate_dials_is_owed_only_where_the_mates_dial_others() -> None:
    h = Health("a", "vast", ssh=True, agent=True, peers_in=0, star_only=True)
    dialled = Health("b", "vast", ssh=True, agent=True, peers_in=1, peers_out=1)
    lonely = Health("c", "vast", ssh=True, agent=True, peers_in=1, peers_out=0)
    assert ports.owed(data(40001), h, [dialled, lonely], True) == (
        "its mapping 10.77.1.2:40001 is dialled by none of its 2 mates, while 1 of them dial "
        "others")
    assert ports.owed(data(40001), h, [lonely], True) is None  # it dials no one: no evidence
    early = Health("a", "vast", ssh=True, agent=True, peers_in=0, star_only=None)
    assert ports.owed(data(40001), early, [dialled], True) is None  # not one interval yet
    one = Health("a", "vast", ssh=True, agent=True, peers_in=1, star_only=True)
    assert ports.owed(data(40001), one, [dialled], True) is None  # dialled, if not enough


def test_a_listing_without_the_mapping_keeps_the_known_one() -> None:
    """Vast lists running boxes with `ports` null for minutes: no evidence the port went."""
    known = ("10.77.1.2", 40001)
    running = Box("vast", "1", "a", "RTX 4090", 1, 0.3, "running", ssh_host="h", ssh_port=22,
                  public_ip="10.77.1.2")
    assert running.p2p_endpoint(known) == known
    booting = Box("vast", "1", "a", "RTX 4090", 1, 0.3, "provisioning")
    assert booting.p2p_endpoint(known) == known


# -- the loop's replacement -------------------------------------------------------------------


def porting_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 verdicts: dict[str, Health], budget: float = 1000) -> Loop:
    cfg = replace(make_cfg(tmp_path), daily_budget_usd=budget)
    monkeypatch.setattr(lifecycle, "host_key_if_ready",
                        lambda b: "ssh-ed25519 AAAA" if b.ssh_ready else None)
    monkeypatch.setattr(loop_mod.rent_mod, "wait_ready", lambda _c, reg, _p, labels: {
        label: lifecycle.pin(reg, reg.get(label), "ssh-ed25519 AAAA") for label in labels})

    def check(_cfg: Any, built: Any) -> list[Health]:
        hosts = built.groups["standing"]
        out = [verdicts.get(label) or Health(label, "vast", ssh=True, agent=True, synced=True,
                                             peers_in=2, peers_out=2) for label, _ in hosts]
        ports.judge(hosts, out, cfg.loop.interval_s)  # the real rule on the listing's data
        return out

    converged: list[list[str]] = []
    lp = Loop(cfg, {"vast": client("vast")}, echo=lambda _: None,
              converge_fn=lambda _c, labels: converged.append(labels), check_fn=check,
              peers_fn=lambda _c, _labels: None)  # the peers files written, every time
    lp.converged = converged  # type: ignore[attr-defined]
    return lp


def peers_settled(lp: Loop) -> None:
    """The peers files as written long enough ago for every reading to postdate them."""
    from fleet.state.loop_memory import Memory

    mem = Memory.load(lp.cfg.registry)
    mem.peers_at = {role: "2026-01-01T00:00:00Z" for role in mem.peers}
    mem.save(lp.cfg.registry)


def standing(lp: Loop, *rows: Row) -> None:
    for r in rows:
        lp.reg.update(r.label, host_key="ssh-ed25519 AAAA", standing=True,
                      standing_since="2026-01-01T00:00:00Z")  # stood long since
        lifecycle.record(lp.reg, r.label, client("vast").box(r.provider_id or ""))  # type: ignore[arg-type]


def portless_box(sbx: Sandbox, lp: Loop, label: str) -> tuple[Row, list[dict[str, Any]]]:
    """A standing box rented while no Vast host maps a port; returns it and those hosts."""
    machines = portless_market(sbx, lp.cfg)
    old = rent_standing(lp.cfg, lp.reg, label)
    wait_running(sbx)
    standing(lp, old)
    return old, machines


def offer_port(sbx: Sandbox, machine: dict[str, Any]) -> None:
    with ControlClient(sbx.control.url) as c:
        c.shape_machine("vast", machine["machine_id"], direct_port_count=100)


def blank_ports(lp: Loop, box_ids: set[str]) -> dict[str, bool]:
    """While the returned switch is on, Vast lists the boxes `box_ids` running, SSH-ready
    through its proxy (ssh_host/ssh_port, as every Vast instance has), with `ports` not (yet)
    populated: Vast's slow boot / skypilot #7336 ("ports null for minutes"), a listing that
    is running but says less."""
    vast = lp.providers["vast"]
    real = vast._box  # type: ignore[attr-defined]
    on = {"on": True}

    def _box(inst: dict[str, Any]) -> Any:
        if on["on"] and str(inst.get("id")) in box_ids:
            inst = {**inst, "ports": None}
        return real(inst)

    vast._box = _box  # type: ignore[attr-defined]
    return on


def replacing(sbx: Sandbox, lp: Loop, label: str) -> tuple[Row, Row]:
    """A portless standing box and the replacement the loop rents once a host maps a port,
    up and standing (not yet checked): (old, new)."""
    old, machines = portless_box(sbx, lp, label)
    offer_port(sbx, machines[-1])
    lp.tick()
    new = next(r for r in lp.reg.rows() if r.move_of == old.label)
    wait_running(sbx)
    lp.reg.update(new.label, standing=True)
    return old, new


def test_a_box_owed_a_port_is_replaced_once_an_offer_maps_one_and_kept_until_it_is_dialled(
        sbx: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    machines = vast_machines(sbx, lp.cfg)
    with ControlClient(sbx.control.url) as c:  # the cheapest host maps no port; one more does
        c.shape_machine("vast", machines[0]["machine_id"], price_per_gpu=0.01)
    mate = rent_standing(lp.cfg, lp.reg, "live-q-mmmmmm")
    machines = portless_market(sbx, lp.cfg, mate)
    full(sbx, mate)
    old = rent_standing(lp.cfg, lp.reg, "live-q-oooooo")
    assert old.note and old.note.startswith("owed a port")
    wait_running(sbx)
    standing(lp, mate, old)
    t = lp.tick()  # no offer maps a port: the box stays, said with the reason
    assert t.owed_ports == {old.label: "no mapped p2p port: vast lists no public mapping of "
                                       "port 26611"}
    assert f"{old.label}: owed a port (no mapped p2p port: vast lists no public mapping of " \
           f"port 26611); it stays, tried again next tick: vast offers no RTX 4090 x1 that " \
           "maps one" in t.actions, t.actions
    assert [r.label for r in lp.reg.rows() if r.live] == [mate.label, old.label]
    t = lp.tick()  # and again on the next tick
    assert any(a.startswith(f"{old.label}: owed a port") for a in t.actions)

    port_host = machines[-1]
    with ControlClient(sbx.control.url) as c:
        c.shape_machine("vast", port_host["machine_id"], direct_port_count=100)
    t = lp.tick()
    new = next((r for r in lp.reg.rows() if r.move_of == old.label), None)
    assert new is not None, t.actions
    # a hand-given label's successor is labelled in the fleet's own form, never `-r1`
    assert new.label != f"{old.label}-r1" and new.move_for == "port"
    assert new.place == f"vast machine {port_host['machine_id']}"
    assert [new.label] in lp.converged  # type: ignore[attr-defined]
    wait_running(sbx)
    lp.reg.update(new.label, standing=True)
    verdicts[new.label] = Health(new.label, "vast", ssh=True, agent=True, synced=True,
                                 peers_in=0)  # well and synced, but no mate dials it yet
    t = lp.tick()
    assert lp.reg.get(old.label).live  # type: ignore[union-attr]
    assert f"{old.label}: kept until {new.label} is checked well, synced and dialled " \
           "(0 inbound peers of 2)" in t.actions, t.actions
    assert f"{old.label}: owed a port (no mapped p2p port: vast lists no public mapping of " \
           f"port 26611); its replacement {new.label} is on its way" in t.actions, t.actions
    verdicts[new.label] = Health(new.label, "vast", ssh=True, agent=True, synced=False,
                                 peers_in=2, problems=["node: not synced"])
    lp.tick()  # dialled, not synced: still kept
    assert lp.reg.get(old.label).live  # type: ignore[union-attr]
    del verdicts[new.label]
    with ControlClient(sbx.control.url) as c:  # more hosts map a port: none is rented for it
        c.shape_machine("vast", machines[-2]["machine_id"], direct_port_count=100)
    t = lp.tick()
    assert [r.label for r in lp.reg.rows() if r.move_of == old.label] == [new.label], t.actions
    gone = lp.reg.get(old.label)
    assert gone is not None and gone.status == "destroyed", t.actions
    assert gone.note is not None and gone.note.startswith(f"replaced by {new.label}, which "
                                                          "maps a p2p port ")
    assert client("vast").box(old.provider_id or "") is None
    assert {r.label for r in lp.reg.rows() if r.live} == {mate.label, new.label}
    t = lp.tick()
    assert t.owed_ports == {} and t.actions == []


def test_a_replacement_over_the_budget_is_not_rented_and_the_box_stays(
        sbx: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lp = porting_loop(tmp_path, monkeypatch, {})
    old, machines = portless_box(sbx, lp, "live-b-oooooo")
    lp.cfg = replace(lp.cfg, daily_budget_usd=old.usd_per_hour * 24 + 0.01)  # the one box only
    offer_port(sbx, machines[-1])
    t = lp.tick()
    assert [r.label for r in lp.reg.rows() if r.live] == [old.label], t.actions
    assert any(a.startswith(f"{old.label}: owed a port") and "failed" in a
               and "budget" in a for a in t.actions), t.actions


def test_a_replacement_that_maps_no_port_by_its_deadline_is_given_up_and_the_box_stays(
        sbx: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lp = porting_loop(tmp_path, monkeypatch, {})
    old, machines = portless_box(sbx, lp, "live-n-oooooo")
    port_host = machines[-1]
    offer_port(sbx, port_host)
    lp.tick()
    new = next(r for r in lp.reg.rows() if r.move_of == old.label)
    with ControlClient(sbx.control.url) as c:  # the host's ports go before the box is up
        c.shape_machine("vast", port_host["machine_id"], direct_port_count=0)
    wait_running(sbx)
    lp.reg.update(new.label, standing=True)
    t = lp.tick()  # its mapping may yet be listed: it waits
    assert lp.reg.get(new.label).live, t.actions  # type: ignore[union-attr]
    assert f"{old.label}: kept until {new.label} is checked well, synced and dialled (no " \
           "mapped p2p port listed yet)" in t.actions, t.actions
    lp.cfg = replace(lp.cfg, loop=replace(lp.cfg.loop, move_timeout_s=0.0))
    t = lp.tick()
    gone = lp.reg.get(new.label)
    assert gone is not None and gone.status == "destroyed", t.actions
    assert lp.reg.get(old.label).live  # type: ignore[union-attr]
    assert gone.note is not None and "not done" in gone.note


def test_a_mapping_the_listing_drops_is_kept_and_owes_nothing_by_itself(
        sbx: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the nodes that stop reaching it tell that a mapping went (the undialable rule)."""
    lp = porting_loop(tmp_path, monkeypatch, {})
    row = rent_standing(lp.cfg, lp.reg, "live-d-aaaaaa")
    wait_running(sbx)
    standing(lp, row)
    mapped = lp.reg.get(row.label).p2p_public_port  # type: ignore[union-attr]
    assert mapped
    with ControlClient(sbx.control.url) as c:
        c.shape_machine("vast", (client("vast").box(row.provider_id or "")  # type: ignore[union-attr]
                                 .machine_id), direct_port_count=0)
    t = lp.tick()
    assert lp.reg.get(row.label).p2p_public_port == mapped  # type: ignore[union-attr]
    assert t.owed_ports == {}


# -- the roster's in/out -----------------------------------------------------------------------


def test_the_roster_shows_the_peers_of_the_loop_s_last_tick_while_it_is_fresh(
        tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from fleet.cli import boxes_cmd
    from fleet.core.times import iso
    from fleet.state import last_tick

    cfg = make_cfg(tmp_path)
    reg = Registry(cfg.registry)
    r = Row("live-a", "vast", "live", "standing", "RTX 4090", 1, 0.3, "running")
    h = Health("live-a", "vast", ssh=True, agent=True, peers_in=0, peers_out=2,
               star_only=True, port_owed="no mapped p2p port: vast lists none")
    now = datetime.now(UTC)
    last_tick.save(cfg.registry, 7, iso(now), [h])
    tick = boxes_cmd._fresh_tick(cfg, reg)
    assert tick is not None and tick.verdict("live-a") == h
    assert boxes_cmd.roster_row(r, "running", None, tick.verdict("live-a"))["in/out"] == \
        "0/2 star-only owed a port"
    assert boxes_cmd.roster_row(r, "running")["in/out"] == "-"
    assert boxes_cmd.peers_caption(tick) == f"in/out: the p2p peers of the loop's tick 7 at " \
                                            f"{iso(now)}"
    old = now - timedelta(seconds=3 * cfg.loop.interval_s)
    last_tick.save(cfg.registry, 6, iso(old), [h])  # a loop that stopped: its peers say nothing
    assert boxes_cmd._fresh_tick(cfg, reg) is None
    assert boxes_cmd.peers_caption(None).startswith("in/out: no fresh loop tick on record")


def test_an_undialable_mapping_is_acted_on_only_once_the_peers_files_settled(
        sbx: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A box just joined (or remapped): its mates' peers files were rewritten moments ago,
    and a node's reading may be older than that. No mate dialling it is the fleet's own lag
    until SETTLE_S has passed; then it is the mapping's fault."""
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    a = rent_standing(lp.cfg, lp.reg, "live-s-aaaaaa")
    b = rent_standing(lp.cfg, lp.reg, "live-s-bbbbbb")
    wait_running(sbx)
    standing(lp, a, b)
    verdicts[a.label] = Health(a.label, "vast", ssh=True, agent=True, synced=True,
                               peers_in=0, star_only=True)
    assert lp.tick().owed_ports == {}  # the peers files are written at this tick's end
    t = lp.tick()
    assert t.owed_ports == {} and not [r for r in lp.reg.rows() if r.move_of], t.actions
    peers_settled(lp)
    t = lp.tick()
    a = lp.reg.get(a.label)  # type: ignore[assignment]
    assert t.owed_ports == {a.label: f"its mapping {a.public_ip}:{a.p2p_public_port} is "
                                     "dialled by none of its 1 mates, while 1 of them dial "
                                     "others"}, t.actions
