"""`fleet.ops.moving`: what a running move does on a tick, from plain rows and what the tick
checked (no provider, SSH host or file)."""

from __future__ import annotations

from typing import Any

from fleet.core.boxes import Row
from fleet.ops.moving import Step, step


def row(label: str, **kw: Any) -> Row:
    fields: dict[str, Any] = {"status": "running", "provider_id": label, "standing": True} | kw
    return Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=0.3, **fields)


OLD = row("live-a", place="m1")


def place_move(**kw: Any) -> Row:
    return row("live-a-r1", move_of="live-a", move_for="place", **({"place": "m2"} | kw))


def port_move(**kw: Any) -> Row:
    return row("live-a-r1", move_of="live-a", move_for="port", **({"place": "m2"} | kw))


def ask(new: Row, **kw: Any) -> Step:
    given: dict[str, Any] = {"done": False, "checked": True, "ported": None,
                             "old_owes_no_port": False, "crowd": [], "age": 10.0,
                             "timeout": 1800.0} | kw
    return step(new, OLD, **given)


def test_a_place_move_finishes_only_once_its_box_is_well_and_synced() -> None:
    assert ask(place_move(), done=True) == Step("finish")
    assert ask(place_move()) == Step("wait", "")


def test_a_place_move_of_a_p2p_role_waits_for_its_mesh_too() -> None:
    assert ask(place_move(), done=True, ported="1 inbound peers of 2") == \
        Step("wait", "1 inbound peers of 2")


def test_a_place_move_that_landed_on_a_held_or_unnamed_place_is_given_up() -> None:
    assert ask(place_move(), done=True, crowd=["live-b"]) == \
        Step("abandon", "it landed on m2, held by live-b")
    assert ask(place_move(place=None), done=True) == \
        Step("abandon", "it landed on a place its provider does not name")


def test_a_move_past_its_deadline_is_given_up_only_on_a_tick_that_checked_its_box() -> None:
    assert ask(place_move(), age=1900.0) == \
        Step("abandon", "not well and synced 1900 s after its rent (move_timeout_s 1800)")
    assert ask(place_move(), age=1900.0, checked=False).do == "wait"  # a blind tick
    assert ask(port_move(), age=1900.0, ported="no mapped p2p port listed yet") == \
        Step("abandon", "not done 1900 s after its rent (move_timeout_s 1800)")
    assert ask(port_move(), age=1900.0, checked=False).do == "wait"


def test_a_port_move_finishes_once_done_and_dialled_and_is_given_up_when_the_old_port_works(
        ) -> None:
    assert ask(port_move(), done=True) == Step("finish")
    assert ask(port_move(), done=True, ported="its inbound peers not read yet") == \
        Step("wait", "its inbound peers not read yet")
    assert ask(port_move()) == Step("wait", "not yet well and synced")
    assert ask(port_move(), done=True, old_owes_no_port=True) == \
        Step("abandon", "live-a owes no port any more")


def test_a_port_move_is_never_judged_by_the_place_it_landed_on() -> None:
    assert ask(port_move(place=None), done=True, crowd=["live-b"]) == Step("finish")
