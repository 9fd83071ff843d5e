"""Unfinished rents outside the fleet's own label form (the fakes of loop_fixture.py): the box
replacing a hand-labelled one gets a label of the fleet's form, resumed like any; a row under a
hand-given label (or an older loop's `-r<n>` of one) is never resumed onto a box found by its
label (it may be a person's), and is given up at its deadline once its provider lists no box
under it, so its roster place is rented anew. Never blind: not while its provider fails or its
listing has a gap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loop_fixture import FakeVast, make
from test_loop_guards import BlindVast, add_box, blind

from fleet.boxes import lifecycle
from fleet.core.boxes import Row
from fleet.core.errors import ProviderError
from fleet.ops import loop as loop_mod
from fleet.providers.base import Box, Unreadable

LONG_AGO = "2000-01-01T00:00:00Z"


def unfinished(loop: loop_mod.Loop, label: str, created: str, **kw: Any) -> Row:
    row = Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
              gpu_count=1, usd_per_hour=0.3, status="renting", created_at=created, **kw)
    loop.reg.add(row)
    return row


def listed(vast: FakeVast, box_id: str, label: str, status: str = "running") -> None:
    vast.listed[box_id] = Box("vast", box_id, label, "RTX 4090", 1, 0.3, status,
                              ssh_host=f"10.9.9.{box_id[-1]}", ssh_port=22)


def converged_into(loop: loop_mod.Loop, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """What the loop converges from now on; every box answers with the same host key."""
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda *_a, **_k: "ssh-ed25519 BBBB")
    got: list[list[str]] = []
    loop.converge_fn = lambda _c, labels: got.append(labels)  # type: ignore[func-returns-value]
    return got


def hand_row_kept(loop: loop_mod.Loop, label: str = "web1") -> None:
    row = loop.reg.get(label)
    assert row is not None and row.status == "renting" and row.live, row
    assert row.provider_id is None and row.host_key is None, row


# -- the loop's successor of a hand-labelled box -----------------------------------------------

def test_the_box_replacing_a_hand_labelled_one_gets_a_label_of_the_fleets_form(
        tmp_path: Path) -> None:
    """A person may call the box replacing their web1 `web1-r1` too: the loop's re-rent or
    move of web1 is labelled in the fleet's own form, and resumed like any of its rents."""
    loop, vast, _ = make(tmp_path)
    fid = loop.reg.fleet_id()
    assert loop._successor("web1", loop.reg.rows()) is None  # a generated label
    ours = f"live-{fid}-vast-00000a"
    assert loop._successor(ours, loop.reg.rows()) == f"{ours}-r1"


def test_a_persons_box_under_an_older_loops_rerent_label_is_never_taken(
        tmp_path: Path) -> None:
    """An older loop's re-rent of live-web1 as live-web1-r1, whose create never landed, and a
    person's box under that label: never adopted or destroyed; the row is treated as a
    hand-labelled one."""
    loop, vast, _ = make(tmp_path)
    add_box(loop, vast, 1)
    unfinished(loop, "live-web1-r1", loop_mod.now_iso(), rerent_of="live-web1")
    listed(vast, "900", "live-web1-r1", status="exited")  # a person's, stopped by its owner
    for _ in range(3):
        t = loop.tick()
    assert vast.destroyed == [], t.actions  # not destroyed as "exited before it was ready"
    assert any("live-web1-r1: an unfinished rent under a hand-given label; vast lists box 900"
               in a for a in t.actions), t.actions
    hand_row_kept(loop, "live-web1-r1")


# -- a hand-given label -------------------------------------------------------------------------

def test_a_hand_labelled_unfinished_row_with_no_box_is_given_up_at_its_deadline(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    unfinished(loop, "web1", loop_mod.now_iso())  # `fleet rent live --label web1`, killed
    t = loop.tick()  # within its deadline: it fills the roster's place
    hand_row_kept(loop)
    assert t.owed == [] and any("`fleet rent live --label web1` resumes it" in a
                                for a in t.actions), t.actions
    loop.reg.update("web1", created_at=LONG_AGO)
    t = loop.tick()
    row = loop.reg.get("web1")
    assert row is not None and row.status == "failed" and "never landed" in (row.note or "")
    assert [o.rerent_of for o in t.owed] == [None], t.actions  # the roster's place owed again
    assert vast.destroyed == []


@pytest.mark.parametrize("status", ["running", "exited"])
def test_a_hand_labelled_unfinished_row_whose_label_lists_a_box_is_never_adopted_or_given_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str) -> None:
    loop, vast, _ = make(tmp_path)
    unfinished(loop, "web1", LONG_AGO)
    listed(vast, "900", "web1", status)  # it may be a person's
    converged = converged_into(loop, monkeypatch)
    for _ in range(3):
        t = loop.tick()
        assert any(a.startswith("web1: an unfinished rent under a hand-given label; vast lists "
                                "box 900 under it") and "`fleet rent live --label web1` "
                                "resumes it" in a for a in t.actions), t.actions
    hand_row_kept(loop)
    assert vast.destroyed == [] and "900" in vast.listed and converged == []
    vast.listed.clear()  # its owner destroyed it: nothing under the label any more
    loop.tick()
    assert loop.reg.get("web1").status == "failed"  # type: ignore[union-attr]


def test_a_hand_labelled_box_the_listing_left_out_but_the_lookup_finds_is_never_given_up(
        tmp_path: Path) -> None:
    loop, vast = blind(tmp_path)[:2]
    unfinished(loop, "web1", LONG_AGO)
    listed(vast, "900", "web1")
    vast.hidden = {"900"}  # the listing leaves it out; asked by its label, vast finds it
    t = loop.tick()
    hand_row_kept(loop)
    assert any("lists box 900 under it" in a for a in t.actions), t.actions


class Lookup(BlindVast):
    """A listing that answers while a lookup by label fails."""

    def __init__(self) -> None:
        super().__init__()
        self.lookup_fails = True

    def find_by_label(self, label: str) -> Box | None:
        if self.lookup_fails:
            raise ProviderError("vast", "list", "HTTP 429")
        return super().find_by_label(label)


def test_a_hand_labelled_unfinished_row_is_never_given_up_while_its_provider_fails(
        tmp_path: Path) -> None:
    loop, _, _ = make(tmp_path)
    vast = Lookup()
    loop.providers = {"vast": vast}
    unfinished(loop, "web1", LONG_AGO)
    vast.failing = True  # the listing fails
    for _ in range(2):
        assert loop.tick().provider_errors
    hand_row_kept(loop)
    vast.failing = False  # the listing answers, the lookup by label fails
    t = loop.tick()
    assert any(a.startswith("web1: resuming the unfinished rent failed") for a in t.actions)
    hand_row_kept(loop)
    vast.odd = {"7": Unreadable("vast", "7", "web1", "no ssh_port")}  # a row it may be
    t = loop.tick()
    assert any(a.startswith("web1: not judged this tick") for a in t.actions), t.actions
    hand_row_kept(loop)
    vast.odd, vast.lookup_fails = {}, False  # vast answers all, with no box under web1
    loop.tick()
    assert loop.reg.get("web1").status == "failed"  # type: ignore[union-attr]


def test_a_hand_labelled_unfinished_row_is_never_given_up_on_a_listing_gap(
        tmp_path: Path) -> None:
    loop, vast, _ = blind(tmp_path)
    for n in (1, 2, 3):
        add_box(loop, vast, n)
    unfinished(loop, "web1", LONG_AGO)
    vast.hidden = {"1", "2"}  # the listing leaves out 2 of 3 boxes; by id they are there
    t = loop.tick()
    assert any(a.startswith("web1: no box under its hand-given label at vast, but its listing "
                            "left out 2 of its 3 boxes at once: kept") for a in t.actions), \
        t.actions
    hand_row_kept(loop)
    vast.hidden = set()
    loop.tick()
    assert loop.reg.get("web1").status == "failed"  # type: ignore[union-attr]
