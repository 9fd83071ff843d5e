"""Standing boxes of one role spread across places: the rent's order and row notes against the
sandbox's real Vast and RunPod APIs (in-process, on loopback), and the loop's moves of a box
that shares its place. The sandbox tests (tests/integration/test_spread_sandbox.py) do the same
with real boxes, the real deploy and the real checks."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from fleet.boxes import lifecycle
from fleet.boxes.sshkeys import ensure_key
from fleet.core import config
from fleet.core.boxes import Row
from fleet.core.config import Config
from fleet.core.verdicts import Health
from fleet.ops import loop as loop_mod
from fleet.ops import offers as offers_mod
from fleet.ops import rent, spread
from fleet.ops.loop import Loop
from fleet.providers.base import Offer, place_of
from fleet.providers.factory import get_provider
from fleet.providers.http import RetryPolicy
from fleet.state.registry import Registry
from sandbox.control_client import ControlClient
from sandbox.daemon import Sandbox

TOML = """
[fleet]
registry = "{tmp}/boxes.json"
ssh_key = "{tmp}/key"
known_hosts = "{tmp}/known_hosts"
daily_budget_usd = 1000
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node"]
admitted_driver = "580.95.05"
p2p_port = 26611
{spread}
"""


def make_cfg(tmp_path: Path, spread_on: bool = True) -> Config:
    ensure_key(tmp_path / "key")
    text = TOML.format(tmp=tmp_path, spread="" if spread_on else "spread = false")
    return config.parse(tomllib.loads(text), tmp_path / "fleet.toml")


def client(name: str) -> Any:
    return get_provider(name, retry=RetryPolicy(attempts=2), sleep=lambda s: None)


def vast_machines(sbx: Sandbox, cfg: Config) -> list[dict[str, Any]]:
    """The Vast RTX 4090 machines an offer search for the role admits, cheapest first."""
    with ControlClient(sbx.control.url) as c:
        ms = [m for m in c.machines() if m["provider"] == "vast" and m["card"] == "RTX 4090"
              and m["driver"] == cfg.role("live").admitted_driver and m["direct_port_count"]
              and m["free_gpus"]]
    return sorted(ms, key=lambda m: m["price_per_gpu"])


def crowd(sbx: Sandbox, machines: list[dict[str, Any]], keep: int | None = None) -> str:
    """The market of the issue: the cheapest offer on one machine with room for 4 boxes; with
    `keep`, only that many other machines still offered. Returns the cheap machine's id."""
    big = next(m for m in machines if m["free_gpus"] >= 4)
    with ControlClient(sbx.control.url) as c:
        c.shape_machine("vast", big["machine_id"], price_per_gpu=0.05)
        others = [m for m in machines if m is not big]
        for m in others[keep:] if keep is not None else []:
            c.shape_machine("vast", m["machine_id"], other_tenants=m["free_gpus"])
    return str(big["machine_id"])


def offer_free_place(sbx: Sandbox, machines: list[dict[str, Any]], cheap: str
                     ) -> dict[str, Any]:
    """Another machine in the cheap one's tier, its GPUs freed: a free place is offered."""
    tier = next(m["datacenter"] for m in machines if m["machine_id"] == cheap)
    free = next(m for m in machines if m["machine_id"] != cheap and m["datacenter"] == tier)
    with ControlClient(sbx.control.url) as c:
        c.shape_machine("vast", free["machine_id"], other_tenants=0)
    return free


def rent_standing(cfg: Config, reg: Registry, label: str) -> Row:
    vast = client("vast")
    found, failures = offers_mod.search(cfg.role("live"), [vast], card="RTX 4090")
    assert found and not failures
    return rent.rent(cfg, reg, cfg.role("live"), found, {"vast": vast}, label=label).row


def test_four_standing_boxes_land_on_four_machines_though_the_cheapest_holds_them_all(
        sbx: Sandbox, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    cheap = crowd(sbx, vast_machines(sbx, cfg))
    reg = Registry(cfg.registry)
    rows = [rent_standing(cfg, reg, f"live-spread-{i}") for i in range(4)]
    places = [r.place for r in rows]
    assert len(set(places)) == 4 and all(p and p.startswith("vast machine ") for p in places)
    assert places[0] == f"vast machine {cheap}"  # the cheapest first, once
    assert all(r.note is None for r in rows)
    with ControlClient(sbx.control.url) as c:  # where the provider put them is where the rows say
        put = {i["label"]: i["machine_id"] for i in c.instances()}
    assert [f"vast machine {put[r.label]}" for r in rows] == places


def test_with_one_machine_left_the_box_shares_it_and_its_row_says_why(
        sbx: Sandbox, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    cheap = crowd(sbx, vast_machines(sbx, cfg), keep=0)
    reg = Registry(cfg.registry)
    first = rent_standing(cfg, reg, "live-spread-a")
    second = rent_standing(cfg, reg, "live-spread-b")
    assert first.place == second.place == f"vast machine {cheap}"
    assert first.note is None
    assert second.note == (f"shares vast machine {cheap} with live-spread-a: every offer was "
                           "on a place the role already holds")
    assert spread.per_place(reg.rows()) == {f"vast machine {cheap}": 2}


def test_a_role_with_spread_off_takes_the_cheapest_wherever(sbx: Sandbox,
                                                            tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, spread_on=False)
    cheap = crowd(sbx, vast_machines(sbx, cfg))
    reg = Registry(cfg.registry)
    rows = [rent_standing(cfg, reg, f"live-off-{i}") for i in range(3)]
    assert {r.place for r in rows} == {f"vast machine {cheap}"}
    assert all(r.note is None for r in rows)


def test_runpod_offers_name_their_data_center_and_the_rent_asks_for_it(
        sbx: Sandbox, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    runpod = client("runpod")
    found = runpod.offers(card="RTX 4090")
    secure = [o for o in found if o.cloud == "SECURE"]
    with ControlClient(sbx.control.url) as c:
        centres = {m["location"] for m in c.machines() if m["provider"] == "runpod"
                   and m["card"] == "RTX 4090" and m["datacenter"] and m["free_gpus"]}
    assert {o.data_center for o in secure} == centres and len(centres) >= 2
    assert all(o.offer_id.endswith(f":{o.data_center}") for o in secure)
    assert all(o.data_center is None and o.place is None for o in found
               if o.cloud == "COMMUNITY")
    reg = Registry(cfg.registry)
    rows = []
    for i in range(2):
        rows.append(rent.rent(cfg, reg, cfg.role("live"), secure, {"runpod": runpod},
                              label=f"live-rp-{i}").row)
    assert len({r.place for r in rows}) == 2
    for r in rows:  # the pod is where the offer said: its listing names the same place
        box = runpod.box(r.provider_id or "")
        assert box is not None and box.place == r.place


def test_an_offer_that_names_no_place_says_so_in_the_row() -> None:
    role = config.Role("live", "standing", "img", 20)
    community = Offer("runpod", "t:COMMUNITY", "RTX 4090", 1, 0.3, cloud="COMMUNITY")
    assert spread.note(role, community, {}, [community]) == (
        "placed where the spread cannot see: runpod names no machine or data center for "
        "this offer (COMMUNITY)")
    assert place_of("runpod", "m1", None) is None  # a RunPod machine id is never chosen
    assert place_of("vast", "17", None) == "vast machine 17"


# -- the loop moves a box that shares its place -------------------------------------------


def moving_loop(tmp_path: Path, sbx: Sandbox, monkeypatch: pytest.MonkeyPatch,
                verdicts: dict[str, Health]) -> Loop:
    cfg = make_cfg(tmp_path)
    monkeypatch.setattr(lifecycle, "host_key_if_ready",
                        lambda b: "ssh-ed25519 AAAA" if b.ssh_ready else None)
    converged: list[list[str]] = []

    def check(_cfg: Any, built: Any) -> list[Health]:
        return [verdicts.get(label) or Health(label, "vast", ssh=True, agent=True,
                                              synced=True, peers_in=2)
                for label, _ in built.groups["standing"]]

    def converge(_cfg: Any, labels: list[str]) -> None:
        converged.append(labels)

    lp = Loop(cfg, {"vast": client("vast")}, echo=lambda _: None, converge_fn=converge,
              check_fn=check)
    lp.converged = converged  # type: ignore[attr-defined]
    return lp


def wait_running(sbx: Sandbox) -> None:
    with ControlClient(sbx.control.url) as c:
        c.advance(120)
        c.settle()


def test_the_loop_moves_a_crowded_box_once_a_free_place_is_offered_and_its_mover_is_synced(
        sbx: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    verdicts: dict[str, Health] = {}
    lp = moving_loop(tmp_path, sbx, monkeypatch, verdicts)
    machines = vast_machines(sbx, lp.cfg)
    cheap = crowd(sbx, machines, keep=0)
    # SSH-ready at once: the host key pinned as `wait_ready` does once the box answers
    monkeypatch.setattr(loop_mod.rent_mod, "wait_ready", lambda _c, reg, _p, labels: {
        label: lifecycle.pin(reg, reg.get(label), "ssh-ed25519 AAAA") for label in labels})
    a = rent_standing(lp.cfg, lp.reg, "live-m-aaaaaa")
    b = rent_standing(lp.cfg, lp.reg, "live-m-bbbbbb")
    wait_running(sbx)
    for r in (a, b):
        lp.reg.update(r.label, host_key="ssh-ed25519 AAAA", standing=True)
        lifecycle.record(lp.reg, r.label, client("vast").box(r.provider_id or ""))  # type: ignore[arg-type]
    assert spread.crowded(lp.reg.rows(), lp.cfg.role("live"))[0].label == b.label
    t = lp.tick()  # no free place offered: nothing moves
    assert [r.label for r in lp.reg.rows() if r.live] == [a.label, b.label], t.actions
    free = offer_free_place(sbx, machines, cheap)
    t = lp.tick()
    mover = next((r for r in lp.reg.rows() if r.move_of == b.label), None)
    assert mover is not None, (t.actions, t.dead, t.problems)
    # b's label is hand-given: its mover's is of the fleet's own form, never `-r1`
    assert mover.label != f"{b.label}-r1" and mover.place == f"vast machine {free['machine_id']}"
    assert [mover.label] in lp.converged  # type: ignore[attr-defined]
    wait_running(sbx)
    lp.reg.update(mover.label, standing=True)
    verdicts[mover.label] = Health(mover.label, "vast", ssh=True, agent=True, synced=False,
                                   problems=["node: not synced"])
    t = lp.tick()  # the mover is up but not synced: the crowded box stays
    assert lp.reg.get(b.label).live  # type: ignore[union-attr]
    assert any(f"kept until {mover.label} is checked well and synced" in x for x in t.actions)
    del verdicts[mover.label]
    t = lp.tick()
    gone = lp.reg.get(b.label)
    assert gone is not None and gone.status == "destroyed"
    assert gone.note == (f"moved to {mover.label} (vast machine {free['machine_id']}), off "
                         f"vast machine {cheap}")
    assert client("vast").box(b.provider_id or "") is None
    assert {r.label for r in lp.reg.rows() if r.live} == {a.label, mover.label}
    assert lp.tick().actions == []  # spread: nothing more to move


def test_a_box_rented_before_places_were_recorded_gets_its_place_from_the_listing(
        sbx: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lp = moving_loop(tmp_path, sbx, monkeypatch, {})
    row = rent_standing(lp.cfg, lp.reg, "live-old-aaaaaa")
    wait_running(sbx)
    lp.reg.update(row.label, host_key="ssh-ed25519 AAAA", standing=True, place=None)
    lp.tick()
    assert lp.reg.get(row.label).place == row.place  # type: ignore[union-attr]
    assert row.place and row.place.startswith("vast machine ")


def test_the_roster_names_each_box_s_machine_and_how_many_boxes_it_holds() -> None:
    from fleet.cli.boxes_cmd import roster_row

    def row(label: str, place: str | None) -> Row:
        return Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
                   gpu_count=1, usd_per_hour=0.3, status="running", place=place)
    rows = [row("a", "vast machine 10697"), row("b", "vast machine 10697"),
            row("c", "vast machine 10654"), row("d", None),
            Row("e", "runpod", "live", "standing", "RTX 4090", 1, 0.69, "running",
                place="runpod data center EU-RO-1")]
    places = spread.per_place(rows)
    assert places == {"vast machine 10697": 2, "vast machine 10654": 1,
                      "runpod data center EU-RO-1": 1}
    assert [roster_row(r, "running", places)["machine"] for r in rows] == [
        "10697 (2 boxes)", "10697 (2 boxes)", "10654", "-", "EU-RO-1"]
