"""Unfinished rents outside the fleet's own label form (the fakes of test_loop.py): the `-r<n>`
the loop gave a re-rent or a move of a hand-labelled box is the loop's own label, resumed like
any; a row under a hand-given label is never resumed onto a box found by its label (it may be
a person's), and is given up at its deadline once its provider lists no box under it, so its
roster place is rented anew. Never blind: not while its provider fails or its listing has a
gap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_loop import FakeVast, make, standing_box
from test_loop_guards import BlindVast, add_box, blind

from fleet.boxes import lifecycle
from fleet.core.boxes import Row
from fleet.core.errors import ProviderError
from fleet.ops import loop as loop_mod
from fleet.providers.base import Box, Unreadable
from fleet.state.loop_memory import Memory

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


# -- the loop's own `-r<n>` -------------------------------------------------------------------

@pytest.mark.parametrize("took_over", ["rerent_of", "move_of"])
def test_the_loops_own_rerent_of_a_hand_labelled_box_is_resumed_and_converted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, took_over: str) -> None:
    loop, vast, _ = make(tmp_path)
    standing_box(loop, vast, label="web1", box_id="1")  # `fleet rent live --label web1`
    if took_over == "rerent_of":  # it died and was destroyed; a move keeps it until done
        loop.reg.mark_destroyed("web1")
        vast.listed.clear()
    # the loop's rent of web1-r1: its create's outcome was unknown, and its box landed later
    unfinished(loop, "web1-r1", loop_mod.now_iso(), **{took_over: "web1"})
    listed(vast, "900", "web1-r1")
    converged = converged_into(loop, monkeypatch)
    t = loop.tick()
    row = loop.reg.get("web1-r1")
    assert row is not None and row.provider_id == "900" and row.host_key == "ssh-ed25519 BBBB"
    assert converged == [["web1-r1"]] and t.converged == ["web1-r1"], t.actions


def test_the_loops_own_rerent_of_a_hand_labelled_box_never_ready_is_given_up_at_its_deadline(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    unfinished(loop, "web1-r1", LONG_AGO, rerent_of="web1")
    listed(vast, "900", "web1-r1", status="provisioning")
    t = loop.tick()
    row = loop.reg.get("web1-r1")
    assert vast.destroyed == ["900"], t.actions
    assert row is not None and row.status == "destroyed" and not row.live
    assert [o.rerent_of for o in t.owed] == [None]  # the roster's place is rented anew


def test_two_boxes_under_the_loops_rerent_label_are_neither_adopted_nor_destroyed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, vast, _ = make(tmp_path)
    standing_box(loop, vast, label=f"live-{loop.reg.fleet_id()}-vast-00000b", box_id="2")
    unfinished(loop, "web1-r1", LONG_AGO, rerent_of="web1")
    listed(vast, "900", "web1-r1")
    listed(vast, "901", "web1-r1")  # a person's box under the same label, say
    converged = converged_into(loop, monkeypatch)
    for _ in range(3):
        t = loop.tick()
        assert any(a.startswith("web1-r1: vast lists 2 boxes under its label (900, 901): "
                                "none adopted or destroyed") for a in t.actions), t.actions
        mem = Memory.load(loop.memory_path)  # the orphan's grace long past
        mem.orphans = {k: LONG_AGO for k in mem.orphans}
        mem.save(loop.memory_path)
    assert vast.destroyed == [] and {"900", "901"} <= set(vast.listed)
    hand_row_kept(loop, "web1-r1")
    assert converged == []
    vast.listed.pop("901")  # the operator destroys the one that is not the fleet's
    loop.tick()
    row = loop.reg.get("web1-r1")
    assert row is not None and row.provider_id == "900" and row.host_key is not None
    assert converged == [["web1-r1"]]


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
