"""The fleet page without provider keys: the standing boxes' verdicts and the owed boxes come
from the loop's last tick (dated by it, counted apart from what is checked now, stale past two
loop intervals), money from the cached bills, the registry read now; a missing or damaged
last tick leaves them unknown. `fleet page` run in-process without keys exits 0 and asks no
provider; the page in a real headless Chromium shows the note with the tick's time."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import page_fixture as F
import pytest
from headless_chromium import Chromium, executable
from repo_root import ROOT
from state_fixture import sql

from fleet import page
from fleet.core.times import iso
from fleet.core.verdicts import VERDICTS
from fleet.state import bills, last_tick
from fleet.state.last_tick import LastTick

TICK_AT = F.NOW - timedelta(minutes=12)  # 11:48 UTC, within 2 intervals of 600 s
KEYS = ("runpod", "vast")


def cfg() -> Any:
    """The fixture's fleet.toml with a 10-minute loop: a tick is stale after 20 minutes."""
    c = F.config()
    return replace(c, loop=replace(c.loop, interval_s=600.0))


def tick(at: datetime = TICK_AT, **kw: Any) -> LastTick:
    args: dict[str, Any] = dict(number=42, at=iso(at), health=tuple(F.health()),
                                owed=tuple(F.owed()))
    args.update(kw)
    return LastTick(**args)


def cached_bills(read: datetime = F.NOW - timedelta(minutes=5)) -> bills.Bills:
    midnight = read.replace(hour=0, minute=0, second=0)
    charges = {"vast": {"id-live-vast-a1": 4.0, "id-live-vast-c3": 3.0,
                        "id-bench-vast-e5": 0.2},
               "runpod": {"id-live-runpod-b2": 4.5, "id-bench-runpod-f6": 1.4}}
    return bills.Bills(iso(read), charges, covered={p: iso(read) for p in charges},
                       since=iso(midnight))


def keyless(t: LastTick | None = None, *, missing: tuple[str, ...] = KEYS,
            health: list[Any] | None = None, b: bills.Bills | None = None,
            **kw: Any) -> dict[str, Any]:
    """The fixture fleet's page data as `fleet page` builds it with the keys of `missing`
    gone: no live verdict for their boxes, the tick `t`, the cached bills `b`."""
    b = b if b is not None else cached_bills()
    args: dict[str, Any] = dict(cfg=cfg(), rows=F.rows(), health=health or [],
                                watched=F.watched(), now=F.NOW, keyless=missing, last_tick=t,
                                billed=bills.billed(F.rows(), b, F.NOW), bills_at=b.read_at)
    args.update(kw)
    return page.build(page.PageInputs(**args))


def by_label(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["label"]: b for b in d["boxes"]}


# ---------------------------------------------------------------- the data

def test_without_keys_the_standing_verdicts_are_the_last_ticks_dated_by_it() -> None:
    d = keyless(tick(), owed=[])
    live = page.build(page.PageInputs(cfg(), F.rows(), F.health(), F.watched(), F.NOW,
                                      owed=F.owed()))
    # the same verdicts and problems as a live check that saw what the tick saw ...
    assert [(b["label"], b["verdict"], b["problems"]) for b in d["boxes"]] == \
        [(b["label"], b["verdict"], b["problems"]) for b in live["boxes"]]
    # ... but dated by the tick and marked as the tick's, never as checked now
    for b in d["boxes"]:
        if b["standing"]:
            assert b["verdict_from"] == "last_tick"
            assert b["checked_at"] == "2026-12-02T11:48:00Z"
        else:
            assert b["verdict_from"] == "live"  # one-shot boxes are watched now (SSH)
            assert b["checked_at"] == "2026-12-02T12:00:00Z"
    assert by_label(d)["live-vast-a1"]["checked_at"] == "2026-12-02T11:48:00Z"
    # owed: the tick's (the `owed` passed in is the loop memory's, unused without keys)
    assert d["owed"] == live["owed"] and d["totals"]["owed"] == 1
    src = d["sources"]
    assert src["standing_verdicts"] == {"from": "last_tick", "live_providers": [],
                                        "last_tick_providers": ["runpod", "vast"]}
    assert src["owed"] == {"from": "last_tick", "at": "2026-12-02T11:48:00Z"}
    assert src["last_tick"] == {"number": 42, "at": "2026-12-02T11:48:00Z", "age_s": 720.0,
                                "stale": False, "stale_after_s": 1200.0}
    assert src["live"] == ["registry", "oneshot_verdicts"]
    assert src["from_last_tick"] == ["standing_verdicts", "owed"]
    assert src["keys_missing"] == ["runpod", "vast"]
    assert src["registry"] == {"from": "live", "at": "2026-12-02T12:00:00Z"}
    assert src["note"] == (
        "No provider keys here (RUNPOD_API_KEY, VAST_API_KEY): the standing boxes' verdicts "
        "and the owed boxes are from the loop's last tick (tick 42, 2026-12-02 11:48 UTC, "
        "12 min old), not checked now; money from the cached bills of 11:55 UTC; the registry "
        "is read now and the one-shot boxes watched now.")
    assert page.verdicts_from(d) == "last tick 42 (2026-12-02 11:48 UTC, 12 min old)"


def test_the_counts_keep_the_ticks_verdicts_apart_from_what_is_checked_now() -> None:
    d = keyless(tick())
    by_src = d["totals"]["verdicts_from"]
    assert by_src["last_tick"] == {"down": 1, "problem": 1, "unknown": 0, "well": 1}
    assert by_src["live"] == {"down": 0, "problem": 1, "unknown": 0, "well": 1}  # one-shots
    assert by_src["none"] == dict.fromkeys(VERDICTS, 0)
    assert d["totals"]["verdicts"] == {v: by_src["live"][v] + by_src["last_tick"][v]
                                       for v in VERDICTS}
    html = page.render(d)
    assert 'id="counts-last_tick">As of the last tick at 11:48 UTC' in html
    assert 'id="counts-live">Checked now' in html


def test_a_tick_older_than_two_intervals_is_called_stale() -> None:
    old = keyless(tick(at=F.NOW - timedelta(minutes=21)))  # 1260 s > 2 x 600 s
    assert old["sources"]["last_tick"]["stale"] is True
    assert old["sources"]["note"].endswith(
        "That tick is stale: older than 2 loop intervals (20 min); is the loop running?")
    assert "STALE" in page.verdicts_from(old)
    # still the tick's verdicts, never promoted to live: a well box stays the tick's well
    a1 = by_label(old)["live-vast-a1"]
    assert (a1["verdict"], a1["verdict_from"]) == ("well", "last_tick")
    assert old["totals"]["verdicts_from"]["live"]["well"] == 1  # the one-shot only
    html = page.render(old)
    assert 'class="notice tick stale"' in html and '<span class="tag stale">stale' in html
    edge = keyless(tick(at=F.NOW - timedelta(minutes=20)))  # exactly 2 intervals
    assert edge["sources"]["last_tick"]["stale"] is False
    ahead = keyless(tick(at=F.NOW + timedelta(minutes=11)))  # ahead by more than 1 interval
    assert ahead["sources"]["last_tick"]["stale"] is True
    assert "ahead of this clock" in ahead["sources"]["note"]


def test_no_tick_on_record_leaves_the_verdicts_and_the_owed_unknown() -> None:
    d = keyless(None, owed=F.owed())
    for b in d["boxes"]:
        if b["standing"]:
            assert (b["verdict"], b["verdict_from"], b["checked_at"]) == ("unknown", "none",
                                                                          None)
            assert b["problems"] == [f"not checked: no {b['provider']} key here, and no loop "
                                     "tick on record"]
    assert d["owed"] == [] and d["totals"]["owed"] is None  # unknown, not "nothing owed"
    assert d["totals"]["verdicts_from"]["none"]["unknown"] == 3
    src = d["sources"]
    assert src["last_tick"] is None and src["from_last_tick"] == []
    assert src["standing_verdicts"]["from"] == "unknown" and src["owed"]["from"] == "unknown"
    assert src["note"].startswith("No provider keys here (RUNPOD_API_KEY, VAST_API_KEY) and "
                                  "no loop tick on record: the standing boxes' verdicts and "
                                  "the owed boxes are unknown;")
    assert page.verdicts_from(d) == "unknown (no tick on record)"
    html = page.render(d)
    assert "Owed boxes unknown: no loop tick on record." in html and "owed unknown" in html


@pytest.mark.parametrize("damage", [
    "UPDATE tick_health SET doc = '{broken'",  # a verdict that is not JSON
    "UPDATE ticks SET owed = '{}', provider_errors = 'null'",  # a tick without its lists
    "missing"])
def test_a_missing_or_damaged_last_tick_reads_as_no_tick(tmp_path: Path, damage: str) -> None:
    reg = tmp_path / "state" / "boxes.json"
    if damage != "missing":
        last_tick.save(reg, 42, F.iso(F.NOW), F.health(), F.owed(), now=F.NOW)
        sql(reg, damage)
    t = last_tick.load(reg)
    assert t is None
    d = keyless(t)
    assert {b["verdict"] for b in d["boxes"] if b["standing"]} == {"unknown"}
    assert "no loop tick on record" in d["sources"]["note"]


def test_a_box_the_tick_did_not_check_is_unknown_with_the_ticks_reason() -> None:
    t = tick(health=tuple(F.health()[:2]),
             provider_errors=("vast GET /instances: 503 from 10.20.30.40",))
    c3 = by_label(keyless(t))["live-vast-c3"]
    assert (c3["verdict"], c3["verdict_from"], c3["checked_at"]) == ("unknown", "last_tick",
                                                                     None)
    assert c3["problems"] == ["not checked in the loop's last tick (tick 42): vast GET "
                              "/instances: 503 from [address]"]


def test_with_one_key_missing_its_boxes_come_from_the_tick_the_others_live() -> None:
    vast_now = [h for h in F.health() if h.provider == "vast"]
    d = keyless(tick(), missing=("runpod",), health=vast_now)
    b = by_label(d)
    assert (b["live-vast-a1"]["verdict_from"], b["live-vast-a1"]["checked_at"]) == \
        ("live", "2026-12-02T12:00:00Z")
    assert (b["live-runpod-b2"]["verdict_from"], b["live-runpod-b2"]["checked_at"],
            b["live-runpod-b2"]["verdict"]) == ("last_tick", "2026-12-02T11:48:00Z", "problem")
    src = d["sources"]
    assert src["standing_verdicts"] == {"from": "mixed", "live_providers": ["vast"],
                                        "last_tick_providers": ["runpod"]}
    assert src["note"].startswith(
        "No runpod key here (RUNPOD_API_KEY): the verdicts of runpod's standing boxes and the "
        "owed boxes are from the loop's last tick (tick 42, 2026-12-02 11:48 UTC, 12 min old), "
        "not checked now; vast's standing boxes are checked now;")
    assert page.verdicts_from(d) == \
        "vast checked now; runpod last tick 42 (2026-12-02 11:48 UTC, 12 min old)"
    assert d["totals"]["verdicts_from"]["last_tick"] == {"down": 0, "problem": 1,
                                                         "unknown": 0, "well": 0}


def test_with_every_key_nothing_is_from_the_tick() -> None:
    d = keyless(tick(), missing=(), health=F.health(), owed=F.owed())
    assert d["sources"]["note"] is None and d["sources"]["last_tick"] is None
    assert d["sources"]["standing_verdicts"]["from"] == "live"
    assert d["sources"]["owed"] == {"from": "loop", "at": None}
    assert {b["verdict_from"] for b in d["boxes"]} == {"live"}
    assert page.verdicts_from(d) == "checked now"
    assert 'id="sources-note"' not in page.render(d)
    # a missing key for a provider with no standing box changes nothing either
    only_vast = [r for r in F.rows() if r.provider == "vast"]
    d2 = keyless(tick(), missing=("runpod",), rows=only_vast, health=F.health())
    assert d2["sources"]["note"] is None and d2["sources"]["keys_missing"] == ["runpod"]


def test_money_comes_from_the_cached_bills_while_they_count() -> None:
    fresh = keyless(tick())
    m = fresh["money"]
    assert m["spent_from_bills"] == {"boxes": 5, "of": 5}
    assert m["spent_today_usd"] == pytest.approx(
        bills.spent_from(F.rows(), cached_bills(), F.NOW).total_usd)
    assert fresh["sources"]["money"] == {"from": "bills", "bills_at": "2026-12-02T11:55:00Z",
                                         "boxes_from_bills": 5, "of": 5}
    old = keyless(tick(), b=cached_bills(F.NOW - timedelta(hours=2)))
    assert old["money"]["spent_from_bills"]["boxes"] == 0
    assert old["sources"]["money"]["from"] == "estimate"
    assert "money estimated from the registry's prices (the cached bills of 10:00 UTC are " \
           "too old to count)" in old["sources"]["note"]
    none = keyless(tick(), billed=None, bills_at=None)
    assert "money estimated from the registry's prices (no cached bills)" in \
        none["sources"]["note"]


def test_nothing_of_the_tick_leaks_a_key_an_endpoint_or_an_address(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = "vast_PAGEKEYLESSSECRET0042"
    monkeypatch.setenv("VAST_API_KEY", token)
    health = F.health()
    health[1].problems.append(f"ssh 203.0.113.7:47913 said key {token} at 192.0.2.99")
    t = tick(health=tuple(health), provider_errors=("runpod: 503 from 10.1.2.3",))
    page.write(tmp_path, keyless(t))
    for name in page.FILES:
        text = (tmp_path / name).read_text()
        for secret in (token, "203.0.113.7", "47913", "192.0.2.99", "10.1.2.3",
                       *(s[3] for s in F.SECRETS.values())):
            assert secret not in text, (secret, name)


# ---------------------------------------------------------------- `fleet page` without keys

CONFIG = """
[fleet]
registry = "state/boxes.json"
daily_budget_usd = 50
[loop]
interval_s = 600
orphan_grace_s = 1200
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
"""


def _no_keys_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str,
                  tick_at: datetime | None) -> Any:
    """`fleet page` in-process over the fixture's standing boxes, with no provider key in the
    environment or the key files, and every way of asking a provider made to fail the test."""
    from typer.testing import CliRunner

    from fleet.boxes import inventory
    from fleet.cli import common
    from fleet.cli import main as cli
    from fleet.ops import check as check_mod

    for var in ("RUNPOD_API_KEY", "VAST_API_KEY", "XDG_CONFIG_HOME", "FLEET_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.runpod or ~/.config/vastai key files
    monkeypatch.setenv("COLUMNS", "250")

    def asked(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a provider was asked without a key")

    for mod, name in ((check_mod, "check"), (inventory, "build"), (bills, "refresh"),
                      (bills, "read"), (bills, "spent_today")):
        monkeypatch.setattr(mod, name, asked)
    monkeypatch.setattr(common, "_state", {})
    (tmp_path / "fleet.toml").write_text(CONFIG)
    reg_path = tmp_path / "state" / "boxes.json"
    from fleet.state.registry import Registry

    reg = Registry(reg_path)
    for r in F.rows():
        if r.kind == "standing":  # no one-shot box: nothing for the watchdog to reach
            reg.add(r)
    now = datetime.now(UTC).replace(microsecond=0)
    if tick_at is not None:
        last_tick.save(reg_path, 42, iso(tick_at), F.health(), F.owed())
    bills.save(reg_path, cached_bills(now))
    return CliRunner().invoke(cli.app, ["--config", str(tmp_path / "fleet.toml"), "page",
                                        "--out", str(tmp_path / "out"), *args])


def test_fleet_page_without_keys_exits_0_and_writes_the_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    r = _no_keys_page(tmp_path, monkeypatch, tick_at=at)
    assert r.exit_code == 0, r.output
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["fleet.json", "index.html"]
    doc = json.loads((out / "fleet.json").read_text())
    src = doc["sources"]
    assert src["keys_missing"] == ["runpod", "vast"]
    assert src["last_tick"]["number"] == 42 and src["last_tick"]["at"] == iso(at)
    assert src["last_tick"]["stale"] is False
    assert src["standing_verdicts"]["from"] == "last_tick"
    assert src["money"]["bills_at"] is not None
    assert {b["verdict_from"] for b in doc["boxes"]} == {"last_tick"}
    assert [(b["label"], b["verdict"]) for b in doc["boxes"]] == [
        ("live-vast-c3", "down"), ("live-runpod-b2", "problem"), ("live-vast-a1", "well")]
    assert [o["reason"] for o in doc["owed"]] == [o.reason for o in F.owed()]
    html = (out / "index.html").read_text()
    assert "from the loop&#39;s last tick (tick 42," in html
    # the one-line summary says where the verdicts come from
    assert "verdicts" in r.output and "last tick 42" in r.output, r.output
    assert "error" not in r.output.lower()


def test_fleet_page_without_keys_or_a_tick_says_unknown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = _no_keys_page(tmp_path, monkeypatch, "--json", tick_at=None)
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "out" / "fleet.json").read_text())
    assert json.loads(r.output) == doc
    assert {b["verdict"] for b in doc["boxes"]} == {"unknown"}
    assert doc["totals"]["owed"] is None and doc["sources"]["last_tick"] is None
    assert "no loop tick on record" in doc["sources"]["note"]


# ---------------------------------------------------------------- in a real browser

@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if executable() is None:
        pytest.fail("chromium is missing: install Debian's `chromium` package "
                    "(./run.sh setup does); the page is tested in a real browser")
    with Chromium(tmp_path_factory.mktemp("chromium")) as c:
        yield c


def test_the_keyless_page_in_headless_chromium(browser: Chromium, tmp_path: Path) -> None:
    d = keyless(tick())
    page.write(tmp_path / "page", d)
    url = (tmp_path / "page" / "index.html").as_uri()
    start = len(browser.events)
    browser.viewport(1280, 900)
    browser.open(url)
    assert browser.requests(start) == [url] and browser.console(start) == []
    note = browser.evaluate("document.getElementById('sources-note').innerText")
    assert note == f"Not live: {d['sources']['note']}"
    assert "from the loop's last tick (tick 42, 2026-12-02 11:48 UTC, 12 min old)" in note
    assert browser.evaluate("getComputedStyle(document.getElementById('sources-note'))"
                            ".display") != "none"
    # each standing row says its verdict is the tick's, with the tick's time
    cells = browser.evaluate("""[...document.querySelectorAll('#boxes tbody tr')].map(tr =>
      [tr.dataset.label, tr.dataset.from,
       tr.querySelector('[data-th="Last check"]').innerText.trim()])""")
    for label, src, text in cells:
        b = by_label(d)[label]
        assert src == b["verdict_from"]
        if b["verdict_from"] == "last_tick":
            assert text.replace("\n", " ") == "11:48 tick 42", (label, text)
    # the counts: checked now and as of the tick, each under its own heading
    heads = browser.evaluate("[...document.querySelectorAll('#health h3')].map(h => "
                             "h.innerText.replace(/\\s+/g, ' ').trim())")
    assert heads == ["Checked now 12:00 UTC",
                     "As of the last tick at 11:48 UTC tick 42, 12 min old"]
    sources = browser.evaluate("document.getElementById('sources').innerText")
    assert "Standing boxes' verdicts" in sources and "tick 42 at 2026-12-02 11:48 UTC" in \
        sources
    shot = browser.screenshot(tmp_path / "fleet-page-keyless.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("FLEET_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "fleet-page-keyless.png")
    # a phone: the note and the sources wrap, nothing scrolls sideways
    browser.viewport(390, 844)
    assert browser.evaluate("document.documentElement.scrollWidth <= innerWidth")
    browser.screenshot(tmp_path / "fleet-page-keyless-narrow.png")
    browser.viewport(1280, 900)

    # a stale tick: the note and the rows say so
    stale = keyless(tick(at=F.NOW - timedelta(hours=3)))
    page.write(tmp_path / "stale", stale)
    stale_url = (tmp_path / "stale" / "index.html").as_uri()
    start = len(browser.events)
    browser.open(stale_url)
    assert browser.requests(start) == [stale_url] and browser.console(start) == []
    note = browser.evaluate("document.getElementById('sources-note').innerText")
    assert "(tick 42, 2026-12-02 09:00 UTC, 3.0 h old)" in note and "stale" in note
    assert browser.evaluate("document.getElementById('sources-note').classList.contains"
                            "('stale')")
    assert browser.evaluate("document.querySelectorAll('#boxes .tag.stale').length") == 3
    browser.screenshot(tmp_path / "fleet-page-keyless-stale.png")
