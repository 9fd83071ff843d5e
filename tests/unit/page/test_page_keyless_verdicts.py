"""The keyless page against hostile or stale input: a tick verdict that cannot be this
box's, a damaged entry, a stored verdict nested too deep, an address ending a sentence, a
time with an offset. (An older fleet's last_tick.json that is a FIFO or a link to /dev/zero:
`fleet state import`'s, in test_state_db.)"""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import page_fixture as F
import pytest
import test_page_keyless as K
from state_fixture import sql

from fleet import page
from fleet.core.verdicts import Health
from fleet.state import last_tick

REG = "state/boxes.json"


def _by(d):
    return {b["label"]: b for b in d["boxes"]}


def test_a_box_rented_after_the_tick_under_a_label_the_tick_judged_is_not_well() -> None:
    # live-vast-a1 destroyed and rented again 5 min ago; the tick (12 min ago) judged the old one
    rows = [replace(r, created_at=F.iso(F.NOW - timedelta(minutes=5)), provider_id="id-new")
            if r.label == "live-vast-a1" else r for r in F.rows()]
    d = K.keyless(K.tick(), rows=rows)
    a1 = _by(d)["live-vast-a1"]
    assert a1["verdict"] != "well", a1   # not the old box's verdict, dated before the box


def test_a_tick_verdict_for_the_label_on_another_provider_is_not_this_boxs() -> None:
    h = [Health("live-vast-a1", "runpod", ssh=True, agent=True)]  # another fleet's box
    d = K.keyless(K.tick(health=tuple(h)))
    assert _by(d)["live-vast-a1"]["verdict"] != "well"


@pytest.mark.parametrize("entry", [
    {"label": "live-vast-a1", "provider": "vast"},                       # no problems field
    {"label": "live-vast-a1", "provider": "vast", "ssh": False, "agent": False,
     "problems": [], "well": False},                                       # says not well
])
def test_a_hand_edited_or_partial_health_entry_never_reads_well(tmp_path: Path, entry) -> None:
    reg = tmp_path / REG
    last_tick.save(reg, 7, F.iso(F.NOW - timedelta(minutes=3)), [], now=F.NOW)
    sql(reg, "INSERT INTO tick_health (number, pos, label, doc) VALUES (7, 0, ?, ?)",
        (entry["label"], json.dumps(entry)))  # written by hand, past `Health`'s checks
    t = last_tick.load(reg)
    d = K.keyless(t)
    assert _by(d)["live-vast-a1"]["verdict"] != "well"  # a box nobody reached never reads well


def test_a_deeply_nested_last_tick_reads_as_no_tick(tmp_path: Path) -> None:
    reg = tmp_path / REG
    last_tick.save(reg, 7, F.iso(F.NOW - timedelta(minutes=3)), F.health()[:1], now=F.NOW)
    sql(reg, "UPDATE tick_health SET doc = ?", ("[" * 200000,))
    assert last_tick.load(reg) is None  # no RecursionError: `fleet page` goes on


def test_an_address_at_the_end_of_a_sentence_in_the_tick_is_scrubbed(tmp_path: Path) -> None:
    t = K.tick(health=tuple(F.health()[:2]),
               provider_errors=("vast: connection to 192.0.2.77 refused. Retrying",))
    health = F.health()
    health[1].problems.append("ssh: no route to host 198.18.0.9.")
    t2 = K.tick(health=tuple(health))
    page.write(tmp_path / "a", K.keyless(t))
    page.write(tmp_path / "b", K.keyless(t2))
    for sub in ("a", "b"):
        for name in page.FILES:
            text = (tmp_path / sub / name).read_text()
            assert "192.0.2.77" not in text and "198.18.0.9" not in text, (sub, name)


def test_a_tick_time_with_an_offset_is_named_in_utc() -> None:
    # 13:48+02:00 is 11:48 UTC: the page must not call it 13:48 UTC
    d2 = K.keyless(replace(K.tick(), at="2026-12-02T13:48:00+02:00"))
    assert "13:48 UTC" not in d2["sources"]["note"], d2["sources"]["note"]


def test_a_box_the_registry_saw_stop_after_the_tick_is_not_well() -> None:
    rows = [replace(r, stopped_at=F.iso(F.NOW - timedelta(minutes=2)))
            if r.label == "live-vast-a1" else r for r in F.rows()]
    d = K.keyless(K.tick(), rows=rows)
    assert _by(d)["live-vast-a1"]["verdict"] != "well"  # the registry's later read says stopped


def test_the_places_map_is_scrubbed_like_each_boxs_place(tmp_path: Path) -> None:
    rows = [replace(r, place="vast machine 203.0.113.200") if r.label == "live-vast-a1" else r
            for r in F.rows()]
    d = K.keyless(K.tick(), rows=rows)
    assert _by(d)["live-vast-a1"]["place"] == "vast machine [address]"
    assert "203.0.113.200" not in json.dumps(d)  # data["places"] keys scrubbed too
