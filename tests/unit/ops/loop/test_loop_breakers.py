"""Deaths judged per provider: a breaker per provider holds the deaths its provider does not
confirm when many of its boxes fail at once; "no such box" by id is never a death without a
failed SSH check; a restart on the provider's side is no death before its own deadline. The
fakes are loop_fixture.py's, with a second provider beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loop_fixture import FakeVast, make
from test_loop_guards import age_orphans, unreached_rent

from fleet.boxes import lifecycle
from fleet.core.boxes import Row
from fleet.core.config import Want
from fleet.core.errors import FleetError, ProviderError
from fleet.core.verdicts import Health
from fleet.ops import loop as loop_mod
from fleet.providers.base import Box
from fleet.state.loop_memory import Memory

LONG_AGO = "2000-01-01T00:00:00Z"


class FakeRunpod(FakeVast):
    name = "runpod"


class Blank(FakeVast):
    """An account that answers, but lists nothing and has no box of any id: the key now
    points at another account, or an incident on the provider's side."""

    def __init__(self) -> None:
        super().__init__()
        self.blank = False

    def boxes(self) -> list[Any]:
        return [] if self.blank else super().boxes()

    def box(self, box_id: str) -> Box | None:
        return None if self.blank else super().box(box_id)

    def find_by_label(self, label: str) -> Box | None:
        return None if self.blank else super().find_by_label(label)


def add(loop: loop_mod.Loop, p: FakeVast, n: int) -> Row:
    label = f"live-{loop.reg.fleet_id()}-{p.name}-{n:06x}"
    row = Row(label=label, provider=p.name, role="live", kind="standing", card="RTX 4090",
              gpu_count=1, usd_per_hour=0.3, status="running", provider_id=str(n),
              host_key="ssh-ed25519 AAAA", ssh_host=f"10.0.0.{n}", ssh_port=22, standing=True)
    loop.reg.add(row)
    p.listed[str(n)] = Box(p.name, str(n), label, "RTX 4090", 1, 0.3, "running",
                           ssh_host=f"10.0.0.{n}", ssh_port=22)
    return row


def ssh_down_for(loop: loop_mod.Loop, down: set[str]) -> list[str]:
    """Checks where the labels in `down` do not answer SSH; returns the labels probed."""
    probed: list[str] = []

    def check(_cfg: Any, built: Any) -> list[Health]:
        got = [lb for lb, _ in built.groups["standing"]]
        probed.extend(got)
        return [Health(lb, "vast", ssh=lb not in down, agent=lb not in down) for lb in got]

    loop.check_fn = check
    return probed

def vanish(loop: loop_mod.Loop, vast: FakeVast) -> tuple[Row, Box]:
    """A box whose provider stops listing it, and whose SSH fails: marked vanished."""
    row = add(loop, vast, 1)
    box = vast.listed.pop("1")
    ssh_down_for(loop, {row.label})
    loop.tick()
    loop.tick()
    assert loop.reg.get(row.label).status == "vanished"  # type: ignore[union-attr]
    return row, box


def ticks_past_the_orphan_grace(loop: loop_mod.Loop, n: int) -> loop_mod.Tick:
    """`n` ticks, every orphan seen past its grace after each; the last tick."""
    for _ in range(n):
        t = loop.tick()
        mem = Memory.load(loop.cfg.registry)
        mem.orphans = {k: LONG_AGO for k in mem.orphans}
        mem.save(loop.cfg.registry)
    return t


def back_while_its_rerent_boots(loop: loop_mod.Loop, vast: FakeVast, row: Row, box: Box) -> str:
    """The vanished box listed again (and answering) while its re-rent, created, is not yet
    SSH-ready; the re-rent's label."""
    r1 = f"{row.label}-r1"
    loop.reg.add(Row(label=r1, provider="vast", role="live", kind="standing", card="RTX 4090",
                     gpu_count=1, usd_per_hour=0.3, status="provisioning", provider_id="2",
                     rerent_of=row.label))
    vast.listed["2"] = Box("vast", "2", r1, "RTX 4090", 1, 0.3, "provisioning")
    vast.listed["1"] = box
    ssh_down_for(loop, set())
    return r1



def two_providers(tmp_path: Path) -> tuple[loop_mod.Loop, FakeVast, FakeRunpod]:
    loop, vast, _ = make(tmp_path)
    runpod = FakeRunpod()
    loop.providers = {"vast": vast, "runpod": runpod}
    return loop, vast, runpod


# -- the breaker is per provider ------------------------------------------------------------

def test_two_of_four_failing_ssh_on_one_provider_are_held_by_its_breaker(
        tmp_path: Path) -> None:
    loop, vast, runpod = two_providers(tmp_path)
    v1, v2 = add(loop, vast, 1), add(loop, vast, 2)
    r3, r4 = add(loop, runpod, 3), add(loop, runpod, 4)
    ssh_down_for(loop, {v1.label, v2.label})  # the operator's path to vast's boxes is down
    for _ in range(4):
        t = loop.tick()
        assert t.dead == {} and sorted(t.well) == sorted([r3.label, r4.label]), t
        assert any(a.startswith("breaker vast: no death of its boxes counted this tick (2 of "
                                "2 fail at once") for a in t.actions), t.actions
    assert vast.destroyed == [] and runpod.destroyed == []
    assert Memory.load(loop.cfg.registry).dead == {}


def test_a_death_the_provider_reports_is_never_held_by_its_breaker(tmp_path: Path) -> None:
    loop, vast, runpod = two_providers(tmp_path)
    rows = [add(loop, vast, n) for n in (1, 2, 3)]
    add(loop, runpod, 4)
    ssh_down_for(loop, {rows[0].label, rows[1].label})
    vast.listed["3"].status = "exited"  # its host died, and vast says so
    loop.tick()
    t = loop.tick()
    assert any(a.startswith("breaker vast:") for a in t.actions), t.actions
    assert vast.destroyed == ["3"] and set(t.dead) == {rows[2].label}, t


def test_boxes_whose_host_their_provider_lost_and_ssh_cannot_reach_are_deaths_not_held(
        tmp_path: Path) -> None:
    """Two boxes on one host that died: the provider lists both `unknown` (it lost the host)
    and SSH reaches neither. Both sides see it: neither breaker holds these deaths."""
    loop, vast, runpod = two_providers(tmp_path)
    v1, v2 = add(loop, vast, 1), add(loop, vast, 2)
    add(loop, runpod, 3)
    ssh_down_for(loop, {v1.label, v2.label})
    for n in ("1", "2"):
        vast.listed[n].status = "unknown"
    for _ in range(2):
        t = loop.tick()
        assert set(t.dead) == {v1.label, v2.label}, t.actions  # not held for ever
        assert not any(a.startswith("breaker:") for a in t.actions), t.actions
    assert vast.destroyed == ["1"]  # the second waits on the disruption budget (1 of 1)


def test_a_breaker_stays_open_while_none_of_its_providers_boxes_answers(
        tmp_path: Path) -> None:
    """The path to vast is cut, and one of its two boxes is on a host that died (listed
    unknown): that one is a death and is replaced; the other, healthy behind the cut, must not
    be destroyed once it is the only vast box judged (the breaker by attrition)."""
    loop, vast, runpod = two_providers(tmp_path)
    v1, v2 = add(loop, vast, 1), add(loop, vast, 2)
    r3 = add(loop, runpod, 3)
    ssh_down_for(loop, {v1.label, v2.label})
    vast.listed["1"].status = "unknown"
    for _ in range(2):
        t = loop.tick()
    assert vast.destroyed == ["1"], t.actions
    for _ in range(4):  # no replacement offered: v2 is the only vast box judged
        t = loop.tick()
        assert v2.label not in t.dead, t.actions  # not dead, then destroyed
        assert any(a.startswith("breaker vast:") and "still open" in a
                   for a in t.actions), t.actions
    assert vast.destroyed == ["1"]
    ssh_down_for(loop, set())  # the path is back: v2 answers
    t = loop.tick()
    assert v2.label in t.well and r3.label in t.well, t.actions
    assert Memory.load(loop.cfg.registry).breakers == []


def test_a_ready_rent_the_fleet_cannot_reach_counts_for_its_providers_breaker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path to vast is cut: its one standing box and the replacement rent it has under
    way (ready at vast, unreached by the fleet's SSH) both fail. Found by the simulation:
    the standing box, judged alone, was destroyed."""
    loop, vast, runpod = two_providers(tmp_path)
    v1 = add(loop, vast, 1)
    add(loop, runpod, 3)
    unreached_rent(loop, vast, monkeypatch)
    ssh_down_for(loop, {v1.label})
    for _ in range(3):
        t = loop.tick()
        assert v1.label not in t.dead, t.actions
        assert any(a.startswith("breaker vast:") for a in t.actions), t.actions
    assert vast.destroyed == []


def test_hung_logins_are_deaths_no_breaker_holds(tmp_path: Path) -> None:
    """Both boxes of a provider whose sshd takes the login and never runs the command: the
    path to them works, so no breaker holds them (before: kept, dead, for ever); the
    disruption budget alone paces them."""
    loop, vast, runpod = two_providers(tmp_path)
    v1, v2 = add(loop, vast, 1), add(loop, vast, 2)
    add(loop, runpod, 3)

    def check(_cfg: Any, built: Any) -> list[Health]:
        return [Health(lb, "vast", hung=lb in (v1.label, v2.label), ssh=lb not in
                       (v1.label, v2.label), agent=lb not in (v1.label, v2.label),
                       problems=["ssh: connected, but the command did not start within 75 s"]
                       if lb in (v1.label, v2.label) else [])
                for lb, _ in built.groups["standing"]]

    loop.check_fn = check
    for _ in range(2):
        t = loop.tick()
        assert set(t.dead) == {v1.label, v2.label}, t.actions  # not held for ever
        assert not any(a.startswith("breaker:") for a in t.actions), t.actions
    assert vast.destroyed == ["1"]  # the second waits on the disruption budget


def test_a_hung_box_its_provider_no_longer_lists_is_held_like_its_other_boxes(
        tmp_path: Path) -> None:
    """Found by the simulation: the key sees an empty account (a listing with none of the
    fleet's boxes, no such box by id) while one box's login hangs. Its death is the
    breaker's to judge: before, it was marked vanished, re-rented, and swept when the
    account came back."""
    loop, vast, runpod = two_providers(tmp_path)
    v1, _ = add(loop, vast, 1), add(loop, vast, 2)
    add(loop, runpod, 3)
    blank = Blank()
    blank.listed = vast.listed
    loop.providers["vast"] = blank
    blank.blank = True

    def check(_cfg: Any, built: Any) -> list[Health]:
        return [Health(lb, "vast", hung=lb == v1.label, ssh=lb != v1.label,
                       agent=lb != v1.label) for lb, _ in built.groups["standing"]]

    loop.check_fn = check
    for _ in range(3):
        t = loop.tick()
        assert v1.label not in t.dead, t.actions
    assert all(r.live for r in loop.reg.rows()), loop.reg.rows()


def test_no_such_box_from_a_provider_that_lists_the_fleet_is_a_death_its_breaker_never_holds(
        tmp_path: Path) -> None:
    """Found by the simulation: a registry restored from an older copy holds rows whose boxes
    were destroyed since; the provider lists the fleet's other boxes and says it has no box
    of those ids. Its breaker, open for a third box that does not answer, held them live for
    ever. Believed only without a listing gap (most of its boxes left out at once: that may
    be the provider's own incident, and the breaker holds it)."""
    loop, vast, runpod = two_providers(tmp_path)
    rows = [add(loop, vast, n) for n in (1, 2, 3, 4, 5)]
    add(loop, runpod, 6)
    del vast.listed["1"], vast.listed["2"]  # 2 of 5 left out: no gap
    ssh_down_for(loop, {rows[0].label, rows[1].label, rows[2].label})
    for _ in range(2):
        t = loop.tick()
        assert any(a.startswith("breaker vast:") for a in t.actions), t.actions
    assert {rows[0].label, rows[1].label} <= set(t.dead), t.actions
    got = {r.label: r for r in loop.reg.rows()}
    assert not got[rows[0].label].live and not got[rows[1].label].live, t.actions
    assert got[rows[2].label].live and rows[2].label not in t.dead  # held by the breaker


def test_no_such_box_for_most_of_a_providers_boxes_at_once_is_held(tmp_path: Path) -> None:
    """What once went wrong: 3 of 4 left out of the listing, no such box by id, SSH failing
    (one data centre out): believed, they were marked vanished and re-rented at once, and
    the originals were swept when they came back."""
    loop, vast, runpod = two_providers(tmp_path)
    rows = [add(loop, vast, n) for n in (1, 2, 3, 4)]
    add(loop, runpod, 5)
    for n in ("2", "3", "4"):
        del vast.listed[n]
    ssh_down_for(loop, {r.label for r in rows[1:]})
    for _ in range(3):
        t = loop.tick()
    assert all(r.live for r in loop.reg.rows()), t.actions


def test_a_box_whose_host_its_provider_lost_but_that_answers_ssh_is_alive(
        tmp_path: Path) -> None:
    loop, vast, runpod = two_providers(tmp_path)
    v1 = add(loop, vast, 1)
    add(loop, runpod, 2)
    ssh_down_for(loop, set())
    vast.listed["1"].status = "unknown"  # the host's heartbeat lost, the box runs on
    for _ in range(3):
        t = loop.tick()
        assert t.dead == {} and v1.label in t.well, t.actions
    assert vast.destroyed == []


def test_one_box_failing_among_healthy_ones_of_its_provider_is_still_a_death(
        tmp_path: Path) -> None:
    loop, vast, runpod = two_providers(tmp_path)
    v1 = add(loop, vast, 1)
    add(loop, vast, 2)
    add(loop, vast, 3)
    add(loop, runpod, 4)
    ssh_down_for(loop, {v1.label})
    loop.tick()
    t = loop.tick()
    assert vast.destroyed == ["1"] and not any("breaker" in a for a in t.actions), t.actions


def test_an_unfinished_rent_is_kept_while_its_providers_breaker_is_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, vast, runpod = two_providers(tmp_path)
    v1, v2 = add(loop, vast, 1), add(loop, vast, 2)
    add(loop, runpod, 3)
    add(loop, runpod, 4)
    ssh_down_for(loop, {v1.label, v2.label})  # runpod's boxes answer; vast's path is down
    label = unreached_rent(loop, vast, monkeypatch)
    t = loop.tick()
    assert vast.destroyed == [], t.actions
    assert any(a.startswith(f"{label}: not SSH-ready") and "kept" in a for a in t.actions)


# -- "no such box" by id is never a death alone -----------------------------------------------

def test_an_account_that_lists_nothing_and_has_no_box_by_id_loses_no_box(
        tmp_path: Path) -> None:
    loop, _, _ = make(tmp_path)
    vast = Blank()
    loop.providers = {"vast": vast}
    rows = [add(loop, vast, n) for n in (1, 2, 3)]
    vast.blank = True
    probed = ssh_down_for(loop, set())
    for _ in range(4):  # the boxes run on and answer SSH: nothing is dead
        t = loop.tick()
        assert t.dead == {} and not t.owed, t
    assert sorted(set(probed)) == sorted(r.label for r in rows)  # probed where they were
    probed = ssh_down_for(loop, {r.label for r in rows})
    for _ in range(4):  # and when SSH fails too, the gap trips vast's breaker
        t = loop.tick()
        assert t.dead == {} and any(a.startswith("breaker vast:") for a in t.actions), t
    assert all(r.live for r in loop.reg.rows()) and not t.owed
    assert vast.destroyed == [] and Memory.load(loop.cfg.registry).rerents == []


def test_an_unfinished_rent_is_not_given_up_on_no_such_box_while_its_provider_lists_nothing(
        tmp_path: Path) -> None:
    loop, _, _ = make(tmp_path)
    vast = Blank()
    loop.providers = {"vast": vast}
    add(loop, vast, 1)
    add(loop, vast, 2)
    label = f"live-{loop.reg.fleet_id()}-vast-00000a"  # its box landed, never SSH-ready
    loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="renting",
                     provider_id="5", created_at=LONG_AGO))
    vast.listed["5"] = Box("vast", "5", label, "RTX 4090", 1, 0.3, "provisioning")
    vast.blank = True
    for _ in range(3):
        t = loop.tick()
        assert any(a.startswith(f"{label}: vast has no box 5 by id, but its listing left "
                                "out 3 of its 3 boxes") for a in t.actions), t.actions
    assert all(r.live for r in loop.reg.rows()) and vast.destroyed == []


def test_a_lone_box_gone_by_id_that_answers_ssh_is_kept(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = add(loop, vast, 1)
    vast.listed.clear()
    for _ in range(3):
        t = loop.tick()
        assert t.dead == {} and t.well == [row.label], t
    assert loop.reg.get(row.label).live  # type: ignore[union-attr]


def test_a_lone_box_gone_by_id_whose_ssh_fails_is_marked_vanished_and_owed(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = add(loop, vast, 1)
    vast.listed.clear()
    ssh_down_for(loop, {row.label})
    t = loop.tick()
    assert t.dead == {row.label: "vast has no box 1 any more (asked by id), and SSH does "
                                 "not answer"}, t
    t = loop.tick()
    assert loop.reg.get(row.label).status == "vanished" and vast.destroyed == []  # type: ignore[union-attr]
    assert [o.rerent_of for o in t.owed] == [row.label]


def test_a_vanished_box_listed_again_is_the_fleets_again_never_swept(tmp_path: Path) -> None:
    """Found by the simulation: a lone box on an account gone blind, its login hung, was
    marked vanished; when the account came back the box, healed, was swept as the orphan of
    a given-up rent. Listed again under its own label and id, its row is live again."""
    loop, vast, _ = make(tmp_path)
    row, box = vanish(loop, vast)
    vast.listed["1"] = box  # the provider lists it again, and it answers
    ssh_down_for(loop, set())
    t = ticks_past_the_orphan_grace(loop, 3)
    assert vast.destroyed == [], t.actions
    assert loop.reg.get(row.label).live and row.label in t.well, t.actions  # type: ignore[union-attr]


def test_a_vanished_box_listed_again_while_its_rerent_is_unfinished_is_kept_not_swept(
        tmp_path: Path) -> None:
    """What once went wrong: the vanished box came back healthy while its re-rent was still
    booting. The unfinished re-rent filled the roster's place, so the healthy box was swept as
    a given-up rent's orphan, and the place was left to a box not yet converted. The box that
    is back is the fleet's again; the re-rent, never converted, is given up."""
    loop, vast, _ = make(tmp_path)
    row, box = vanish(loop, vast)
    r1 = back_while_its_rerent_boots(loop, vast, row, box)
    t = ticks_past_the_orphan_grace(loop, 3)
    assert "1" not in vast.destroyed, t.actions
    assert loop.reg.get(row.label).live and row.label in t.well, t.actions  # type: ignore[union-attr]
    assert vast.destroyed == ["2"] and not loop.reg.get(r1).live  # type: ignore[union-attr]


def test_a_vanished_box_back_but_restarting_is_not_given_up(tmp_path: Path) -> None:
    """What once went wrong: revived while listed provisioning, it read as an unfinished rent
    long past its deadline and was destroyed in the tick that revived it."""
    loop, vast, _ = make(tmp_path)
    row = add(loop, vast, 1)
    loop.reg.update(row.label, created_at=LONG_AGO)
    box = vast.listed.pop("1")
    ssh_down_for(loop, {row.label})
    loop.tick()
    loop.tick()
    box.status = "provisioning"  # its provider brings it back, restarting
    vast.listed["1"] = box
    t = loop.tick()
    assert vast.destroyed == [], t.actions


def test_a_revived_box_dying_again_spends_the_disruption_budget_anew(tmp_path: Path) -> None:
    """What once went wrong: the records of two boxes' vanishing were read as the retries of
    their later destroys, and both went in one tick of a window that allows one."""
    loop, vast, _ = make(tmp_path)
    loop.cfg = loop.cfg.__class__(**{**loop.cfg.__dict__, "roster": (
        Want("live", "vast", "RTX 4090", 1, 4),)})
    rows = [add(loop, vast, n) for n in (1, 2, 3, 4)]
    back = {n: vast.listed.pop(n) for n in ("1", "2")}
    ssh_down_for(loop, {rows[0].label, rows[1].label})
    loop.tick()
    loop.tick()
    vast.listed.update(back)  # listed again: both revived
    ssh_down_for(loop, set())
    loop.tick()
    ssh_down_for(loop, {rows[0].label, rows[1].label})  # both die, listed running
    loop.tick()
    t = loop.tick()
    assert len(vast.destroyed) == 1, (vast.destroyed, t.actions)


def test_boxes_gone_by_id_never_dilute_the_fleets_own_blindness(tmp_path: Path) -> None:
    """What once went wrong: the fleet's own SSH down for every box, two stale rows gone by id
    counted among the probed boxes but not the silent ones: the guard did not fire and the
    other provider's lone box was destroyed."""
    loop, vast, runpod = two_providers(tmp_path)
    for n in (1, 2, 3):
        add(loop, vast, n)
    add(loop, runpod, 4)
    del vast.listed["2"], vast.listed["3"]
    ssh_down_for(loop, {r.label for r in loop.reg.rows()})
    loop.tick()
    t = loop.tick()
    assert runpod.destroyed == [], t.actions


def test_a_one_shot_box_gone_by_id_is_marked_vanished_only_when_its_ssh_fails(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    add(loop, vast, 1)
    row = Row(label=f"bench-{loop.reg.fleet_id()}-vast-000002", provider="vast", role="bench",
              kind="oneshot", card="RTX 4090", gpu_count=1, usd_per_hour=0.3,
              status="running", provider_id="2", host_key="ssh-ed25519 AAAA",
              ssh_host="10.0.0.2", ssh_port=22)
    loop.reg.add(row)  # its outputs may be unread: a box the fleet stops tracking is swept
    probed = ssh_down_for(loop, set())
    for _ in range(3):
        t = loop.tick()
        assert t.dead == {} and loop.reg.get(row.label).live, t  # type: ignore[union-attr]
    assert row.label in probed
    ssh_down_for(loop, {row.label})
    loop.tick()
    loop.tick()
    assert loop.reg.get(row.label).status == "vanished"  # type: ignore[union-attr]


# -- a restart on the provider's side ----------------------------------------------------------

def test_a_provider_side_restart_is_no_death_before_its_own_deadline(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = add(loop, vast, 1)
    vast.listed["1"].status = "provisioning"  # restarting: SSH is down meanwhile
    ssh_down_for(loop, {row.label})
    for _ in range(loop.cfg.loop.dead_checks + 2):
        t = loop.tick()
        assert t.dead == {} and any(a.startswith(f"{row.label}: restarting on vast's side")
                                    for a in t.actions), t.actions
    assert vast.destroyed == []
    mem = Memory.load(loop.cfg.registry)  # its deadline passes: judged as usual
    mem.restarting = {row.label: LONG_AGO}
    mem.save(loop.cfg.registry)
    loop.tick()
    loop.tick()
    assert vast.destroyed == ["1"]


def test_a_restart_deadline_starts_again_after_the_box_ran(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = add(loop, vast, 1)
    ssh_down_for(loop, {row.label})
    mem = Memory(restarting={row.label: LONG_AGO})  # an old restart, long over
    mem.save(loop.cfg.registry)
    loop.tick()  # running, SSH down: dead check 1
    vast.listed["1"].status = "provisioning"
    loop.tick()
    loop.tick()
    assert vast.destroyed == [], "a restart begun now has its own deadline"


def test_a_restart_clears_the_dead_checks_before_it_and_lasts_until_ssh_answers(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = add(loop, vast, 1)
    add(loop, vast, 2)  # healthy mates: no breaker
    add(loop, vast, 3)
    ssh_down_for(loop, {row.label})
    loop.tick()  # SSH drops a tick before its provider says it restarts: dead check 1
    vast.listed["1"].status = "provisioning"
    loop.tick()
    loop.tick()
    vast.listed["1"].status = "running"  # listed running again, sshd not yet up
    t = loop.tick()
    assert t.dead == {} and vast.destroyed == [], t.actions
    assert any(a.startswith(f"{row.label}: restarting on vast's side (running")
               for a in t.actions), t.actions
    ssh_down_for(loop, set())
    loop.tick()  # SSH answers: the restart is over, and nothing of it counts later
    assert Memory.load(loop.cfg.registry).restarting == {}
    ssh_down_for(loop, {row.label})
    loop.tick()
    assert vast.destroyed == []  # one dead check of its own, not the restart's


def _clear_budget(loop: Any) -> None:
    """An hour passes: the disruption window is whole again."""
    mem = Memory.load(loop.cfg.registry)
    mem.disruptions = []
    mem.save(loop.cfg.registry)


def _clear_budget(loop: Any) -> None:
    """An hour passes: the disruption window is whole again."""
    mem = Memory.load(loop.cfg.registry)
    mem.disruptions = []
    mem.save(loop.cfg.registry)


def test_a_vanished_box_back_while_its_place_is_filled_is_an_orphan_swept(tmp_path: Path) -> None:
    """What once went wrong: a row given up or vanished holds no box, so a box listed under
    it while its place is filled is an orphan, swept within the disruption budget; the
    destroy path refused it as the row's own, and it billed for ever with no live row."""
    loop, vast, _ = make(tmp_path)
    row, box = vanish(loop, vast)
    r1 = f"{row.label}-r1"  # its re-rent, converted and well: the roster (1) is full
    loop.reg.add(Row(label=r1, provider="vast", role="live", kind="standing", card="RTX 4090",
                     gpu_count=1, usd_per_hour=0.3, status="running", provider_id="2",
                     host_key="ssh-ed25519 AAAA", ssh_host="10.0.0.2", ssh_port=22,
                     standing=True, rerent_of=row.label))
    vast.listed["2"] = Box("vast", "2", r1, "RTX 4090", 1, 0.3, "running",
                           ssh_host="10.0.0.2", ssh_port=22)
    vast.listed["1"] = box  # listed again, running, billing
    ssh_down_for(loop, set())
    acts: list[str] = []
    for _ in range(4):
        age_orphans(loop)
        _clear_budget(loop)
        acts += loop.tick().actions
    back = loop.reg.get(row.label)
    assert "1" in vast.destroyed or back.live, [a for a in acts if "vast/1" in a][-2:]


def test_a_rerent_whose_give_up_failed_is_given_up_again_while_its_box_is_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What once went wrong: the give-up of the re-rent was tried once, in the tick that revived
    its box; a failed destroy left two live boxes for one place, both converted."""
    loop, vast, _ = make(tmp_path)
    row, box = vanish(loop, vast)
    r1 = back_while_its_rerent_boots(loop, vast, row, box)
    real = vast.destroy
    fails = {"2"}

    def flaky(box_id: str) -> None:  # one 502 on its terminate
        if box_id in fails:
            fails.discard(box_id)
            raise ProviderError("vast", "destroy", "HTTP 502")
        real(box_id)

    vast.destroy = flaky  # type: ignore[method-assign]
    t = loop.tick()
    assert loop.reg.get(row.label).live, t.actions
    assert any("tried again next tick" in a for a in t.actions), t.actions
    # the re-rent boots and becomes SSH-ready
    vast.listed["2"] = Box("vast", "2", r1, "RTX 4090", 1, 0.3, "running",
                           ssh_host="10.0.0.2", ssh_port=22)
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda *a, **k: "ssh-ed25519 AAAA")
    loop.converge_fn = lambda _c, labels: None  # type: ignore[assignment]
    for _ in range(3):
        t = loop.tick()
    live = [r.label for r in loop.reg.rows() if r.live]
    assert live == [row.label], (live, vast.destroyed, t.actions)


def test_a_destroy_whose_label_lookup_fails_is_said_and_the_tick_goes_on(
        tmp_path: Path) -> None:
    """What once went wrong: the lookup's FleetError escaped the loop's destroy and failed the
    whole tick (nothing judged, replaced, rented or swept)."""
    loop, vast, _ = make(tmp_path)
    row, box = vanish(loop, vast)
    r1 = f"{row.label}-r1"  # its re-rent: create sent, outcome unknown, no id yet
    loop.reg.add(Row(label=r1, provider="vast", role="live", kind="standing", card="RTX 4090",
                     gpu_count=1, usd_per_hour=0.3, status="renting", rerent_of=row.label))
    vast.listed["1"] = box
    ssh_down_for(loop, set())

    def lookup_fails(label: str) -> Box | None:  # the listing answered; this call is 429'd
        raise ProviderError("vast", "list", "HTTP 429")

    vast.find_by_label = lookup_fails  # type: ignore[method-assign]
    t = loop.tick()
    assert any(a.startswith(f"{r1}: destroying the re-rent") and "cannot look" in a
               for a in t.actions), t.actions


def test_adopted_boxes_given_up_at_their_deadline_spend_the_disruption_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry restored from an older copy: three converted standing boxes of the roster
    are adopted as unfinished rents. The fleet's keyscan does not reach them (its path to
    them, as for any box whose SSH fails). A recorded box would be a death, rationed at
    max(1, 25 %) of 4 = 1 an hour; once, the adopted ones were given up as
    never-converted rents, all three in one tick, no budget asked."""
    loop, vast, _ = make(tmp_path)
    loop.cfg = loop.cfg.__class__(**{**loop.cfg.__dict__, "roster": (
        Want("live", "vast", "RTX 4090", 1, 4),)})
    add(loop, vast, 1)  # the one the old copy knew
    for n in (2, 3, 4):
        lb = f"live-{loop.reg.fleet_id()}-vast-{n:06x}"
        vast.listed[str(n)] = Box("vast", str(n), lb, "RTX 4090", 1, 0.3, "running",
                                  ssh_host=f"10.0.0.{n}", ssh_port=22)

    def keyscan(host: str, port: int, timeout: float) -> str:
        raise FleetError(f"ssh-keyscan {host}: connect timed out")

    monkeypatch.setattr(lifecycle, "fetch_host_key", keyscan)
    ssh_down_for(loop, set())
    t = loop.tick()
    assert sum("adopted" in a for a in t.actions) == 3, t.actions
    for r in loop.reg.rows():  # their deadlines pass (3 x ready_timeout_s)
        if r.note and r.note.startswith("adopted"):
            loop.reg.update(r.label, created_at="2000-01-01T00:00:00Z")
    t = loop.tick()
    assert len(vast.destroyed) <= 1, (vast.destroyed, t.actions)
