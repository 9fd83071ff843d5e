"""The loop's money and destroy guards at their edges (the fake provider of loop_fixture.py):
never rent a re-rent twice, never destroy what the fleet does not provably own, never read
its own blindness as a dead box, never leave a rent unfinished, never stop for an odd error."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from loop_fixture import FakeVast, make, standing_box

from fleet.boxes import lifecycle
from fleet.core.boxes import Row
from fleet.core.errors import BudgetExceeded, FleetError, ProviderError
from fleet.core.verdicts import Health, Owed
from fleet.ops import loop as loop_mod
from fleet.ops import rent as rent_mod
from fleet.providers.base import Box, Offer, RentRequest
from fleet.providers.client import check_label
from fleet.state.loop_memory import Memory

LONG_AGO = "2000-01-01T00:00:00Z"


class BlindVast(FakeVast):
    """A listing that may leave boxes out (`hidden`) while asking by id still finds them."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: set[str] = set()
        self.by_id_fails = False

    def boxes(self) -> list[Box]:
        return [b for b in super().boxes() if b.box_id not in self.hidden]

    def box(self, box_id: str) -> Box | None:
        if self.by_id_fails:
            raise ProviderError("vast", "GET /api/v0/instances/{id}/", "HTTP 503")
        return super().box(box_id)


def blind(tmp_path: Path, **kw: Any) -> tuple[loop_mod.Loop, BlindVast, list[bool]]:
    loop, _, ssh = make(tmp_path, **kw)
    vast = BlindVast()
    loop.providers = {"vast": vast}
    return loop, vast, ssh


def add_box(loop: loop_mod.Loop, vast: FakeVast, n: int, label: str | None = None) -> Row:
    label = label or f"live-{loop.reg.fleet_id()}-vast-{n:06x}"
    row = Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
              gpu_count=1, usd_per_hour=0.3, status="running", provider_id=str(n),
              host_key="ssh-ed25519 AAAA", ssh_host=f"10.0.0.{n}", ssh_port=22, standing=True)
    loop.reg.add(row)
    vast.listed[str(n)] = Box("vast", str(n), label, "RTX 4090", 1, 0.3, "running",
                              ssh_host=f"10.0.0.{n}", ssh_port=22)
    return row


def age_orphans(loop: loop_mod.Loop) -> None:
    mem = Memory.load(loop.cfg.registry)
    mem.orphans = {k: LONG_AGO for k in mem.orphans}
    mem.save(loop.cfg.registry)


# -- never rent twice ---------------------------------------------------------------------

def test_a_rerent_rented_before_the_memory_was_saved_is_not_rented_again(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    dead = standing_box(loop, vast)
    loop.reg.mark_destroyed(dead.label)
    vast.listed.clear()
    # the replacement was rented, then the loop was killed before loop.json was saved
    add_box(loop, vast, 2, f"{dead.label}-r1")
    loop.reg.update(f"{dead.label}-r1", rerent_of=dead.label)
    mem = Memory(rerents=[Owed("live", "vast", "RTX 4090", 1, LONG_AGO, rerent_of=dead.label)])
    mem.save(loop.cfg.registry)
    vast.market = [Offer("vast", "9", "RTX 4090", 1, 0.2, driver="580.95.05")]
    t = loop.tick()  # FakeVast.rent raises: nothing may be rented
    assert t.owed == [] and t.replaced == {}
    assert Memory.load(loop.cfg.registry).rerents == []


def test_a_second_box_under_a_live_label_is_an_orphan_and_never_the_one_checked(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = add_box(loop, vast, 1)
    add_box(loop, vast, 2)
    # a create that landed twice: box 3 carries row 1's label
    vast.listed["3"] = Box("vast", "3", row.label, "RTX 4090", 1, 0.3, "running",
                           ssh_host="10.0.0.3", ssh_port=22)
    seen: list[str] = []

    def check(_cfg: Any, built: Any) -> list[Health]:
        seen.extend(d["provider_id"] for _, d in built.groups["standing"])
        return [Health(label, "vast", ssh=True, agent=True) for label, _ in
                built.groups["standing"]]

    loop.check_fn = check
    t = loop.tick()
    assert sorted(seen) == ["1", "2"] and t.orphans == [f"{row.label} (vast/3)"]
    assert any("a second box under a live label" in a for a in t.actions), t.actions
    age_orphans(loop)
    loop.tick()
    assert vast.destroyed == ["3"] and "1" in vast.listed


# -- never destroy what it does not own ----------------------------------------------------

def test_a_box_landing_under_a_given_up_hand_label_is_reported_never_destroyed(
        tmp_path: Path) -> None:
    """A hand-labelled rent given up at its deadline, whose create lands after all: it bills,
    so every tick says so (before: a label under no role's prefix was never said)."""
    loop, vast, _ = make(tmp_path)
    add_box(loop, vast, 1)
    loop.reg.add(Row(label="web1", provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3))
    loop.reg.update("web1", status="failed", destroyed_at=LONG_AGO)
    vast.listed["7"] = Box("vast", "7", "web1", "RTX 4090", 1, 0.3, "running")
    t = loop.tick()
    assert t.orphans == ["web1 (vast/7)"], t.actions
    assert any("orphan web1 (vast/7" in a and "given up" in a and "never destroyed" in a
               for a in t.actions), t.actions
    age_orphans(loop)
    loop.tick()
    assert vast.destroyed == []


def test_a_persons_box_and_another_registrys_are_reported_and_never_destroyed(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    add_box(loop, vast, 1)
    other = "live-abcdef-vast-0b0b0b" if loop.reg.fleet_id() != "abcdef" else \
        "live-fedcba-vast-0b0b0b"
    vast.listed["7"] = Box("vast", "7", "live-debug", "RTX 3090", 1, 0.2, "running")
    vast.listed["8"] = Box("vast", "8", other, "RTX 3090", 1, 0.2, "running")
    vast.listed["9"] = Box("vast", "9", "live-vast-0b0b0b", "RTX 3090", 1, 0.2, "running")
    t = loop.tick()
    assert len(t.orphans) == 3
    age_orphans(loop)
    for _ in range(2):
        t = loop.tick()
    assert vast.destroyed == []
    assert sum("never destroyed" in a for a in t.actions) == 3, t.actions


def test_the_sweep_refuses_with_an_empty_registry(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    fid = loop.reg.fleet_id()  # a registry path that reads as empty, same fleet id
    vast.listed["7"] = Box("vast", "7", f"live-{fid}-vast-0b0b0b", "RTX 3090", 1, 0.2,
                           "running")
    loop.cfg = loop.cfg.__class__(**{**loop.cfg.__dict__, "roster": ()})
    loop.tick()
    age_orphans(loop)
    t = loop.tick()
    assert vast.destroyed == []
    assert any("the registry has no live box" in a for a in t.actions), t.actions


def test_the_sweep_refuses_when_orphans_outnumber_live_boxes(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    add_box(loop, vast, 1)
    fid = loop.reg.fleet_id()
    for n in (7, 8):  # rents given up, whose boxes landed after all
        label = f"live-{fid}-vast-0b0b0{n}"
        loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing",
                         card="RTX 3090", gpu_count=1, usd_per_hour=0.2))
        loop.reg.mark_destroyed(label, "vanished")
        vast.listed[str(n)] = Box("vast", str(n), label, "RTX 3090", 1, 0.2, "running")
    loop.tick()
    age_orphans(loop)
    t = loop.tick()
    assert vast.destroyed == []
    assert any("2 orphans outnumber the registry's 1 live boxes" in a for a in t.actions)


def test_a_registry_behind_the_account_never_sweeps_and_adopts_the_fleets_own_boxes(
        tmp_path: Path) -> None:
    """A registry restored from an older copy: the boxes rented after it carry the fleet's
    exact form and no row (every rent writes its row before the create). They are adopted,
    never swept, and the roster is not rented again on top of them."""
    loop, vast, _ = make(tmp_path)
    for n in (1, 2, 3):
        add_box(loop, vast, n)
    fid = loop.reg.fleet_id()
    newer = [f"live-{fid}-vast-0c0c0{n}" for n in (7, 8)]  # rented after the backup
    for n, label in zip((7, 8), newer, strict=True):
        vast.listed[str(n)] = Box("vast", str(n), label, "RTX 4090", 1, 0.3, "running")
    t = loop.tick()
    assert sum("adopted: a box of this fleet's own form" in a for a in t.actions) == 2, t.actions
    rows = {r.label: r for r in loop.reg.rows()}
    assert all(rows[lb].live and rows[lb].provider_id for lb in newer), rows
    age_orphans(loop)
    for _ in range(2):
        loop.tick()
    assert vast.destroyed == []  # neither destroyed (fewer than the live rows)


def test_an_unrecorded_box_of_the_fleets_form_without_a_price_is_adopted_at_its_shapes(
        tmp_path: Path) -> None:
    """A listing that names no price reads 0.0: adopted so, the box would count as free in the
    budget. It takes the highest price the registry knows for its shape instead, and without
    one it is not adopted (and the budget refuses rents while it is listed)."""
    loop, vast, _ = make(tmp_path)
    add_box(loop, vast, 1)  # the shape's known price: $0.3/h
    fid = loop.reg.fleet_id()
    priced_by_shape, unknown = f"live-{fid}-vast-0c0c07", f"live-{fid}-vast-0c0c08"
    vast.listed["7"] = Box("vast", "7", priced_by_shape, "RTX 4090", 1, 0.0, "running")
    vast.listed["8"] = Box("vast", "8", unknown, "RTX 3090", 1, 0.0, "running")
    t = loop.tick()
    assert loop.reg.get(priced_by_shape).usd_per_hour == 0.3  # type: ignore[union-attr]
    assert loop.reg.get(unknown) is None
    assert any(f"{unknown} (vast/8)" in a and "lists no price" in a for a in t.actions), \
        t.actions
    # reported as an orphan, its price said as unknown, never as $0.000/h
    assert any(a.startswith(f"orphan {unknown} (vast/8, price unknown)") for a in t.actions), \
        t.actions


def test_an_adopted_rerent_covers_the_dead_box_it_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the simulation: the registry restored from before a re-rent holds the dead
    box as live and no row for its replacement. The replacement is adopted as that box's
    re-rent, so the dead box, once marked vanished, is not re-rented a second time."""
    loop, vast, _ = make(tmp_path)
    dead = add_box(loop, vast, 1)
    del vast.listed["1"]  # destroyed after the backup
    r1 = f"{dead.label}-r1"
    vast.listed["2"] = Box("vast", "2", r1, "RTX 4090", 1, 0.3, "running",
                           ssh_host="10.0.0.2", ssh_port=22)
    vast.market = [Offer("vast", "9", "RTX 4090", 1, 0.2, driver="580.95.05")]

    def check(_cfg: Any, built: Any) -> list[Health]:  # the dead box's SSH fails
        return [Health(lb, "vast", ssh=lb != dead.label, agent=lb != dead.label)
                for lb, _ in built.groups["standing"]]

    loop.check_fn = check
    loop.converge_fn = lambda _c, labels: None  # type: ignore[assignment]
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda *a, **k: "ssh-ed25519 AAAA")
    for _ in range(3):  # FakeVast.rent raises: a second re-rent would fail the test
        t = loop.tick()
    row = loop.reg.get(r1)
    assert row is not None and row.rerent_of == dead.label, row
    assert not loop.reg.get(dead.label).live  # type: ignore[union-attr]
    assert t.owed == [], t.owed


def test_an_adopted_second_move_moves_the_box_still_standing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry restored from between two moves of X: its first move X-r1 given up and
    destroyed, its second X-r2 rented after the copy. X-r2 moves X (before: the re-rent of
    the dead X-r1, and X and X-r2 both stood for good, one box more than the roster)."""
    loop, vast, _ = make(tmp_path)
    x = add_box(loop, vast, 1)
    loop.reg.update(x.label, created_at="2026-01-01T00:00:00Z")
    loop.reg.add(Row(label=f"{x.label}-r1", provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3, provider_id="2",
                     move_of=x.label, move_for="place", created_at="2026-01-02T00:00:00Z"))
    loop.reg.update(f"{x.label}-r1", status="destroyed", destroyed_at="2026-01-02T01:00:00Z")
    vast.listed["3"] = Box("vast", "3", f"{x.label}-r2", "RTX 4090", 1, 0.3, "running",
                           ssh_host="10.0.0.3", ssh_port=22, machine_id="m3")
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda *a, **k: "ssh-ed25519 AAAA")
    loop.converge_fn = lambda _c, labels: None  # type: ignore[assignment]
    loop.tick()
    r2 = loop.reg.get(f"{x.label}-r2")
    assert r2 is not None and (r2.move_of, r2.rerent_of) == (x.label, None), r2


def test_a_registry_with_no_live_row_adopts_nothing_and_sweeps_nothing(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = add_box(loop, vast, 1)
    loop.reg.mark_destroyed(row.label)
    del vast.listed["1"]
    fid = loop.reg.fleet_id()
    vast.listed["7"] = Box("vast", "7", f"live-{fid}-vast-0c0c07", "RTX 4090", 1, 0.3,
                           "running")
    loop.cfg = loop.cfg.__class__(**{**loop.cfg.__dict__, "roster": ()})
    loop.tick()
    age_orphans(loop)
    t = loop.tick()
    assert vast.destroyed == [] and not any("adopted" in a for a in t.actions), t.actions
    assert loop.reg.get(f"live-{fid}-vast-0c0c07") is None


def test_a_second_box_under_a_live_hand_given_label_is_reported_never_destroyed(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    add_box(loop, vast, 1)
    row = add_box(loop, vast, 2, label="web1")  # a box the operator labelled by hand
    vast.listed["3"] = Box("vast", "3", row.label, "RTX 4090", 1, 0.3, "running",
                           ssh_host="10.0.0.3", ssh_port=22)
    t = loop.tick()
    assert t.orphans == ["web1 (vast/3)"], t.orphans  # reported
    assert any("web1 (vast/3" in a and "a second box under a live label" in a
               and "never destroyed" in a for a in t.actions), t.actions
    age_orphans(loop)
    loop.tick()
    assert vast.destroyed == []


def test_an_orphan_whose_row_is_live_again_before_its_destroy_is_kept(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    add_box(loop, vast, 1)
    label = f"live-{loop.reg.fleet_id()}-vast-0b0b0b"
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing",
                     card="RTX 3090", gpu_count=1, usd_per_hour=0.2))
    loop.reg.mark_destroyed(label, "vanished")  # given up; its box landed after all
    vast.listed["7"] = Box("vast", "7", label, "RTX 3090", 1, 0.2, "running")
    real_get = loop.reg.get

    def get(lb: str) -> Row | None:  # an operator's resume writes the row live again
        row = real_get(lb)
        if lb == label and row is not None and not row.live:
            loop.reg.update(label, status="provisioning", destroyed_at=None)
        return real_get(lb)

    loop.tick()
    age_orphans(loop)
    loop.reg.get = get  # type: ignore[method-assign]
    t = loop.tick()
    assert vast.destroyed == [] and any(f"{label}'s own: not destroyed" in a
                                        for a in t.actions), t.actions


# -- blindness is not death ------------------------------------------------------------------

def test_a_box_the_listing_leaves_out_is_asked_for_by_id_and_kept(tmp_path: Path) -> None:
    loop, vast, _ = blind(tmp_path)
    row = add_box(loop, vast, 1)
    vast.hidden.add("1")
    for _ in range(3):
        t = loop.tick()
        assert t.dead == {} and t.well == [row.label], t
    vast.by_id_fails = True  # and when asking by id fails too: not judged at all
    for _ in range(3):
        t = loop.tick()
        assert t.dead == {} and row.label not in t.well
    assert vast.destroyed == [] and loop.reg.get(row.label).live  # type: ignore[union-attr]


@pytest.mark.parametrize("status", ["unknown", "provisioning"])
def test_a_box_the_provider_cannot_vouch_for_is_probed_and_kept_when_ssh_answers(
        tmp_path: Path, status: str) -> None:
    loop, vast, ssh = make(tmp_path)
    row = standing_box(loop, vast)
    vast.listed["1"].status = status
    for _ in range(3):
        t = loop.tick()
        assert t.dead == {} and t.well == [row.label], t
    # and when SSH does not answer either, it is dead (a restart, once past its own deadline)
    Memory(restarting={row.label: LONG_AGO}).save(loop.cfg.registry)
    ssh += [False, False]
    loop.tick()
    t = loop.tick()
    assert vast.destroyed == ["1"], t


def test_the_breaker_counts_no_deaths_when_most_boxes_fail_ssh_at_once(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    rows = [add_box(loop, vast, n) for n in (1, 2, 3)]
    down = {rows[0].label, rows[1].label}
    loop.check_fn = lambda _c, built: [Health(lb, "vast", ssh=lb not in down,
                                              agent=lb not in down)
                                       for lb, _ in built.groups["standing"]]
    for _ in range(3):
        t = loop.tick()
        assert t.dead == {} and any(a.startswith("breaker: no deaths counted this tick "
                                                 "(2 of 3 boxes did not answer SSH")
                                    for a in t.actions), t.actions
    assert vast.destroyed == []
    down = {rows[0].label}  # one of three: that box's own death
    loop.tick()
    loop.tick()
    assert vast.destroyed == ["1"]


def test_an_unreadable_ssh_key_is_blindness_not_death(tmp_path: Path) -> None:
    loop, vast, ssh = make(tmp_path)
    standing_box(loop, vast)
    os.unlink(loop.cfg.ssh_key)  # a key the operator moved, or on a volume not mounted
    loop.check_fn = lambda *_: pytest.fail("no box is checked without the fleet's key")
    for _ in range(3):
        t = loop.tick()
        assert t.dead == {} and any("SSH key" in a and "unreadable" in a for a in t.actions)
    assert vast.destroyed == []


# -- never stuck, never silent ----------------------------------------------------------------

def unfinished_row(loop: loop_mod.Loop, created: str, **kw: Any) -> Row:
    row = Row(label=f"live-{loop.reg.fleet_id()}-vast-00000a", provider="vast", role="live",
              kind="standing", card="RTX 4090", gpu_count=1, usd_per_hour=0.3,
              status="renting", created_at=created, **kw)
    loop.reg.add(row)
    return row


def test_a_rent_killed_before_its_box_landed_is_given_up_past_its_deadline(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    fresh = unfinished_row(loop, loop_mod.now_iso())
    t = loop.tick()  # within its deadline: waited for, and it fills the roster
    assert loop.reg.get(fresh.label).status == "renting" and t.owed == []  # type: ignore[union-attr]
    loop.reg.update(fresh.label, created_at=LONG_AGO)
    t = loop.tick()
    row = loop.reg.get(fresh.label)
    assert row is not None and row.status == "failed" and "never landed" in (row.note or "")
    assert [o.rerent_of for o in t.owed] == [None]  # the roster's box is owed again


def test_an_unfinished_rent_whose_box_landed_is_pinned_and_converted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, vast, _ = make(tmp_path)
    row = unfinished_row(loop, loop_mod.now_iso())
    vast.listed["5"] = Box("vast", "5", row.label, "RTX 4090", 1, 0.3, "running",
                           ssh_host="10.0.0.5", ssh_port=22)
    monkeypatch.setattr(lifecycle, "fetch_host_key",
                        lambda host, port, timeout: "ssh-ed25519 BBBB")
    converged: list[list[str]] = []
    loop.converge_fn = lambda _c, labels: converged.append(labels)  # type: ignore[func-returns-value]
    t = loop.tick()
    got = loop.reg.get(row.label)
    assert got is not None and got.provider_id == "5" and got.host_key == "ssh-ed25519 BBBB"
    assert converged == [[row.label]] and t.converged == [row.label]


def test_an_unfinished_rent_never_ready_is_destroyed_past_its_deadline(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = unfinished_row(loop, LONG_AGO, provider_id="5")
    vast.listed["5"] = Box("vast", "5", row.label, "RTX 4090", 1, 0.3, "provisioning")
    loop.tick()
    got = loop.reg.get(row.label)
    assert vast.destroyed == ["5"] and got is not None and got.status == "destroyed"


def test_an_error_that_is_not_a_fleet_error_does_not_end_the_loop(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls = []

    class Odd:
        def tick(self) -> Any:
            calls.append(1)
            if len(calls) == 1:
                raise KeyError("dph_total")
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            raise SystemExit(0)  # the third tick ends the test

    with pytest.raises(SystemExit):
        loop_mod.run(Odd(), 0, once=False, emit=lambda t: None)  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "tick failed: KeyError" in err and "No space left on device" in err
    with pytest.raises(KeyError):
        calls.clear()
        loop_mod.run(Odd(), 0, once=True, emit=lambda t: None)  # type: ignore[arg-type]


def test_a_dead_box_whose_destroy_failed_is_not_marked_vanished_on_a_blind_tick(
        tmp_path: Path) -> None:
    loop, vast, ssh = make(tmp_path)
    row = add_box(loop, vast, 1)
    real = vast.destroy
    fails = [True]

    def destroy(box_id: str) -> None:
        if fails and fails.pop():
            raise ProviderError("vast", "destroy", "box 1 is still listed 120 s after destroy")
        real(box_id)

    vast.destroy = destroy  # type: ignore[method-assign]
    ssh += [False, False]
    loop.tick()
    loop.tick()  # the second dead check: its destroy fails
    vast.failing = True  # then a tick that cannot see the provider
    loop.tick()
    got = loop.reg.get(row.label)
    assert "1" in vast.listed and got is not None and got.live, got


def test_a_box_whose_ssh_moved_to_another_port_is_probed_where_its_key_is_pinned(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    add_box(loop, vast, 1)
    vast.listed["1"].ssh_port = 40022  # restarted: SSH on a new public port
    probed: list[tuple[str, int]] = []

    def check(_c: Any, built: Any) -> list[Health]:
        probed.extend((d["ssh_hostname"], d["ssh_port"]) for _, d in built.groups["standing"])
        return [Health(lb, "vast", ssh=True, agent=True) for lb, _ in built.groups["standing"]]

    loop.check_fn = check
    loop.tick()
    assert probed == [("10.0.0.1", 40022)]
    assert "[10.0.0.1]:40022 ssh-ed25519 AAAA" in loop.cfg.known_hosts.read_text()


# -- a second review's cases ----------------------------------------------------------------

@pytest.mark.parametrize("status", ["exited", "unknown", "stopped"])
def test_an_unfinished_rent_whose_box_is_not_running_is_given_up(tmp_path: Path,
                                                                 status: str) -> None:
    loop, vast, _ = make(tmp_path)
    label = f"live-{loop.reg.fleet_id()}-vast-00000a"
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
                     gpu_count=1, usd_per_hour=0.3, status="renting",
                     created_at=loop_mod.now_iso()))
    # Vast: "OCI runtime create failed" -> exited; host offline -> unknown
    vast.listed["5"] = Box("vast", "5", label, "RTX 4090", 1, 0.3, status)
    loop.tick()  # within the deadline: recorded (status copied from the listing)
    loop.reg.update(label, created_at=LONG_AGO)  # ready_timeout_s long past
    for _ in range(4):
        t = loop.tick()
    row = loop.reg.get(label)
    assert row is not None
    # promise: past ready_timeout_s a box never SSH-ready is destroyed and the place owed again
    assert "5" in vast.destroyed or not row.live, (row.status, row.host_key, t.owed, t.actions)


class PricyVast(FakeVast):
    def __init__(self) -> None:
        super().__init__()
        self.n = 10
        self.listed_price = 5.0
        self.destroy_fails = True

    def rent(self, offer: Offer, req: RentRequest) -> Box:
        self.n += 1
        b = Box("vast", str(self.n), req.label, offer.card, 1, offer.usd_per_hour, "provisioning")
        self.listed[b.box_id] = b
        return b

    def box(self, box_id: str) -> Box | None:
        b = self.listed.get(box_id)
        if b is None:
            return None
        return Box(b.provider, b.box_id, b.label, b.card, 1, self.listed_price, b.status)

    def destroy(self, box_id: str) -> None:
        if self.destroy_fails:
            raise ProviderError("vast", "destroy", f"box {box_id} still listed 120 s after")
        super().destroy(box_id)


def test_a_box_over_budget_whose_destroy_failed_still_counts_against_the_budget(
        tmp_path: Path) -> None:
    loop, _, _ = make(tmp_path, budget=10)
    vast = PricyVast()
    providers = {"vast": vast}
    role = loop.cfg.role("live")
    offer = Offer("vast", "o1", "RTX 4090", 1, 0.3, driver="580.95.05")
    with pytest.raises(ProviderError):  # listed at $5/h (120 $/day > 10): destroy fails
        rent_mod.rent(loop.cfg, loop.reg, role, [offer], providers)
    first = [r for r in loop.reg.rows()][0]
    assert first.live and first.destroy_wanted and "may still bill" in (first.note or "")
    assert first.provider_id in vast.listed  # it is still billing at $5/h
    # a second rent, $0.3/h: with the $5/h box still billing, the run rate is 127 $/day
    vast.listed_price = 0.3
    with pytest.raises(BudgetExceeded):
        rent_mod.rent(loop.cfg, loop.reg, role, [offer], providers)


class LabelVast(FakeVast):
    def rent(self, offer: Offer, req: RentRequest) -> Box:
        check_label(req.label)  # what Client.rent does first
        b = Box("vast", "77", req.label, offer.card, 1, offer.usd_per_hour, "provisioning")
        self.listed["77"] = b
        return b


def test_a_long_hand_label_dying_does_not_stop_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def not_yet(*_: Any, **__: Any) -> None:
        raise FleetError("not SSH-ready yet")  # the next ticks resume it

    monkeypatch.setattr(loop_mod.rent_mod, "wait_ready", not_yet)
    loop, _, ssh = make(tmp_path)
    vast = LabelVast()
    loop.providers = {"vast": vast}
    hand = "live-" + "x" * 53  # 58 characters: rentable (<= 60), its -r1 is 61
    standing_box(loop, vast, hand)
    vast.market = [Offer("vast", "9", "RTX 4090", 1, 0.2, driver="580.95.05")]
    ssh += [False, False, False]
    ticks = []
    n = [0]

    def emit(t: Any) -> None:
        ticks.append(t)
        n[0] += 1
        if n[0] >= 3:
            raise SystemExit(0)

    with pytest.raises(SystemExit):  # the loop must keep ticking: only our SystemExit ends it
        loop_mod.run(loop, 0, once=False, emit=emit)


def test_a_role_removed_while_its_rerent_is_owed_does_not_stop_the_loop(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    Memory(rerents=[Owed("oldrole", "vast", "RTX 4090", 1, LONG_AGO,
                        rerent_of="oldrole-abc123-vast-000001")]).save(loop.cfg.registry)
    n = [0]

    def emit(t: Any) -> None:
        n[0] += 1
        if n[0] >= 2:
            raise SystemExit(0)

    with pytest.raises(SystemExit):
        loop_mod.run(loop, 0, once=False, emit=emit)


def test_resume_does_not_destroy_a_ready_box_when_the_fleet_is_blind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, vast, _ = make(tmp_path)
    label = f"live-{loop.reg.fleet_id()}-vast-00000a"
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
                     gpu_count=1, usd_per_hour=0.3, status="running", provider_id="5",
                     created_at=just_past(loop)))
    vast.listed["5"] = Box("vast", "5", label, "RTX 4090", 1, 0.3, "running",
                           ssh_host="10.0.0.5", ssh_port=22)

    def blind(host: str, port: int, timeout: float) -> str:
        raise FleetError("ssh-keyscan: connect timed out")  # the fleet's own network

    monkeypatch.setattr(lifecycle, "fetch_host_key", blind)
    loop.tick()
    assert vast.destroyed == []


def test_a_late_status_is_not_an_ssh_death(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.boxes import boxssh
    from fleet.ops import check as check_mod
    loop, vast, _ = make(tmp_path)
    add_box(loop, vast, 1)
    add_box(loop, vast, 2)
    add_box(loop, vast, 3)

    def read_fact(data: Any, fact: Any, root: str, deadline: float) -> boxssh.FactRead:
        if str(data["provider_id"]) == "1":  # every box's SSH connects; box 1's status ran
            return boxssh.FactRead(late=True)  # past 30 s (a loaded disk, a slow agent)
        return boxssh.FactRead({})  # the others answer (agent not installed: a problem)

    monkeypatch.setattr(boxssh, "read_fact", read_fact)
    loop.check_fn = check_mod.check
    loop.converge_fn = lambda _c, labels: None  # type: ignore[assignment]
    t = loop.tick()
    dead = [lb for lb in t.dead if lb.endswith("000001")]
    assert dead == [], t.dead  # counted "SSH does not answer"; destroyed on the next tick


def test_a_box_whose_sshd_connects_but_never_runs_the_check_is_dead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.boxes import boxssh
    from fleet.ops import check as check_mod
    loop, vast, _ = make(tmp_path)
    for n in (1, 2, 3):
        add_box(loop, vast, n)

    def read_fact(data: Any, fact: Any, root: str, deadline: float) -> boxssh.FactRead:
        if str(data["provider_id"]) == "1":  # its sshd logs in, and never starts the command
            return boxssh.FactRead(error="connected, but the command did not start within 40 s")
        return boxssh.FactRead({})

    monkeypatch.setattr(boxssh, "read_fact", read_fact)
    loop.check_fn = check_mod.check
    loop.converge_fn = lambda _c, labels: None  # type: ignore[assignment]
    for _tick in (1, 2):
        t = loop.tick()
        dead = [lb for lb in t.dead if lb.endswith("000001")]
        assert len(dead) == 1, t.dead  # not alive for ever, a problem on every tick
        assert any("did not start within 40 s" in a for a in t.actions) or \
            "did not start within 40 s" in " ".join(t.problems.get(dead[0], [])), t.to_dict()
    assert vast.destroyed == ["1"]  # replaced after dead_checks (2) ticks


def test_a_row_given_up_after_its_box_ran_keeps_what_it_spent(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from fleet.core.times import iso
    from fleet.ops import budget
    loop, vast, _ = make(tmp_path)
    now = datetime.now(UTC)
    created = iso(max(now - timedelta(minutes=40), now.replace(hour=0, minute=0, second=0)))
    label = f"live-{loop.reg.fleet_id()}-vast-00000a"
    # a box that ran (status running, id recorded) but never got its host key pinned
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
                     gpu_count=1, usd_per_hour=6.0, status="running", provider_id="5",
                     created_at=created))
    before = budget.project(loop.reg.rows(), 100, now=now).spent_usd
    assert before > 0
    object.__setattr__(loop.cfg.loop, "ready_timeout_s", 60.0)  # its deadline passed
    loop.tick()  # the box is gone from the provider: the row is given up
    row = loop.reg.get(label)
    assert row is not None and not row.live
    after = budget.project(loop.reg.rows(), 100, now=now).spent_usd
    # (the row's end is its destroyed_at, to the second)
    assert after >= before - 0.01, (row.status, before, after)


def just_past(loop: loop_mod.Loop) -> str:
    """A row's creation time a minute past its ready deadline."""
    from datetime import UTC, datetime, timedelta

    from fleet.core.times import iso
    return iso(datetime.now(UTC) - timedelta(seconds=loop.cfg.loop.ready_timeout_s + 60))


def keyscan_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def blind(host: str, port: int, timeout: float) -> str:
        raise FleetError("ssh-keyscan: connect timed out")
    monkeypatch.setattr(lifecycle, "fetch_host_key", blind)


def unreached_rent(loop: loop_mod.Loop, vast: FakeVast, monkeypatch: pytest.MonkeyPatch) -> str:
    """An unfinished rent past its ready deadline whose box Vast calls ready, while the
    fleet's SSH does not reach it; its label."""
    label = f"live-{loop.reg.fleet_id()}-vast-00000a"
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="running",
                     provider_id="5", created_at=just_past(loop)))
    vast.listed["5"] = Box("vast", "5", label, "RTX 4090", 1, 0.3, "running",
                           ssh_host="10.0.0.5", ssh_port=22)
    keyscan_fails(monkeypatch)
    return label


def test_a_box_ready_at_its_provider_is_never_kept_past_three_deadlines(tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    loop, vast, _ = make(tmp_path)
    label = f"live-{loop.reg.fleet_id()}-vast-00000a"
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="running",
                     provider_id="5", created_at=LONG_AGO))
    vast.listed["5"] = Box("vast", "5", label, "RTX 4090", 1, 0.3, "running",
                           ssh_host="10.0.0.5", ssh_port=22)
    keyscan_fails(monkeypatch)
    for _ in range(50):  # decades past ready_timeout_s
        t = loop.tick()
    row = loop.reg.get(label)
    # promise (commit da7cfa6): "never stuck"; the roster place stays held, box billing
    assert vast.destroyed or not row.live or t.owed, (t.actions[-1], t.owed)


def test_no_unfinished_box_is_given_up_while_the_breaker_is_open(tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    loop, vast, _ = make(tmp_path)
    for n in (1, 2, 3):
        add_box(loop, vast, n)

    def check(_c: Any, built: Any) -> list[Health]:  # 2 of 3 fail: breaker opens
        return [Health(lb, "vast", ssh=lb.endswith("000001"), agent=lb.endswith("000001"))
                for lb, _ in built.groups["standing"]]
    loop.check_fn = check
    unreached_rent(loop, vast, monkeypatch)
    t = loop.tick()
    assert any("breaker" in a for a in t.actions), t.actions
    assert vast.destroyed == [], t.actions  # destroyed while the breaker calls the fleet blind


class RentVast(FakeVast):
    def rent(self, offer: Offer, req: RentRequest) -> Box:
        b = Box("vast", "42", req.label, offer.card, 1, offer.usd_per_hour, "provisioning")
        self.listed["42"] = b
        return b


def test_a_rent_resumed_by_hand_gets_a_fresh_deadline(tmp_path: Path) -> None:
    loop, _, _ = make(tmp_path)
    vast = RentVast()
    loop.providers = {"vast": vast}
    label = "live-web1"  # hand-given label, as `fleet rent live --label live-web1`
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="renting",
                     created_at=LONG_AGO))  # yesterday's rent: outcome unknown, no box landed
    offer = Offer("vast", "o1", "RTX 4090", 1, 0.3, driver="580.95.05")
    lifecycle.check_resume(loop.reg.get(label), loop.cfg.role("live"), None)  # type: ignore[arg-type]
    res = rent_mod.rent(loop.cfg, loop.reg, loop.cfg.role("live"), [offer], loop.providers,
                        label=label, resume=True)
    assert res.box.box_id == "42"
    t = loop.tick()  # seconds later, while `fleet rent` waits for SSH
    assert vast.destroyed == [], t.actions


def test_a_hand_labelled_unfinished_rent_is_never_resumed_onto_a_box_not_ours(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    label = "live-1"
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="renting",
                     created_at=loop_mod.now_iso()))
    vast.listed["900"] = Box("vast", "900", label, "RTX 4090", 1, 0.3, "exited")  # not ours
    t = loop.tick()
    assert vast.destroyed == [], t.actions


def test_a_hand_labelled_unfinished_rent_is_never_converged_onto_a_box_not_ours(tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    loop, vast, _ = make(tmp_path)
    label = "live-1"
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="renting",
                     created_at=loop_mod.now_iso()))
    vast.listed["900"] = Box("vast", "900", label, "RTX 4090", 1, 0.3, "running",
                             ssh_host="10.9.9.9", ssh_port=22)
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda h, p, timeout: "ssh-ed25519 X")
    got: list[list[str]] = []
    loop.converge_fn = lambda _c, labels: got.append(labels)  # type: ignore[func-returns-value]
    loop.tick()
    assert got == [], got


@pytest.mark.parametrize("status", ["exited", "running"])
def test_an_unfinished_rent_whose_box_went_never_takes_another_box_under_its_label(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str) -> None:
    """Its id is known and its box gone; a person's box carries the same hand-given label:
    neither adopted (pinned, converged onto) nor destroyed, whatever state it is in."""
    loop, vast, _ = make(tmp_path)
    converged: list[list[str]] = []
    loop.converge_fn = lambda _c, labels: converged.append(labels)
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda *_a, **_k: "ssh-ed25519 THEIRS")
    loop.reg.add(Row(label="live-web1", provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="running",
                     provider_id="5", created_at=LONG_AGO))
    vast.listed["900"] = Box("vast", "900", "live-web1", "RTX 4090", 1, 0.3, status,
                             ssh_host="10.9.9.9", ssh_port=22)
    for _ in range(2):
        loop.tick()
    row = loop.reg.get("live-web1")
    assert vast.destroyed == [] and "900" in vast.listed
    assert row is not None and row.provider_id == "5" and not row.host_key, row
    assert converged == []


def test_a_row_rented_again_during_its_destroy_stays_live(
        tmp_path: Path) -> None:
    """The loop gives up an unfinished rent L (box 5 exited before it was ever ready). While
    its destroy polls (seconds), the operator resumes L as documented (`fleet rent live
    --label L`): box 5 is no longer listed, so L is rented again, box 9, and the row records
    it. The row was then marked destroyed: box 9 billed under a destroyed row. The mark is one
    locked step with the check that the row still names the box destroyed."""
    loop, vast, _ = make(tmp_path)
    label = f"live-{loop.reg.fleet_id()}-vast-00000a"
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="running",
                     provider_id="5"))
    vast.listed["5"] = Box("vast", "5", label, "RTX 4090", 1, 0.3, "exited")
    real = vast.destroy

    def destroy_while_resumed(box_id: str) -> None:
        real(box_id)
        if box_id == "5":  # the operator's concurrent resume lands box 9 under L
            loop.reg.update(label, provider_id="9", status="provisioning")
            vast.listed["9"] = Box("vast", "9", label, "RTX 4090", 1, 0.3, "provisioning")

    vast.destroy = destroy_while_resumed  # type: ignore[method-assign]
    t = loop.tick()
    assert vast.destroyed == ["5"], t.actions
    row = loop.reg.get(label)
    assert row.live or "9" not in vast.listed, (row.status, row.provider_id, t.actions)
