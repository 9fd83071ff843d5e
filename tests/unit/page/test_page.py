"""The fleet page: its data (totals, order, verdicts, the chart), its HTML, what it must never
show, `fleet page`'s bad input, and the page itself in a real headless Chromium."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import page_fixture as F
import pytest
from headless_chromium import Chromium, executable
from repo_root import ROOT

from fleet import page
from fleet.core.config import load
from fleet.ops import budget
from fleet.state.registry import Registry

IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")


def data(**kw: Any) -> dict[str, Any]:
    """The fixture fleet's page data; any of build's arguments can be replaced."""
    args: dict[str, Any] = dict(cfg=F.config(), rows=F.rows(), health=F.health(),
                                watched=F.watched(), now=F.NOW, owed=F.owed())
    args.update(kw)
    return page.build(page.PageInputs(**args))


def by_label(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["label"]: b for b in d["boxes"]}


# ---------------------------------------------------------------- the data

def test_totals_equal_the_sum_of_the_rows() -> None:
    d = data()
    boxes = d["boxes"]
    assert d["totals"]["boxes"] == len(boxes) == 5  # destroyed and failed rows not listed
    assert d["totals"]["usd_per_hour"] == pytest.approx(sum(b["usd_per_hour"] for b in boxes))
    assert d["totals"]["usd_per_hour"] == pytest.approx(0.412 + 0.39 + 0.405 + 0.6 + 0.74)
    assert d["totals"]["usd_per_day"] == pytest.approx(24 * d["totals"]["usd_per_hour"])
    standing = [b for b in boxes if b["standing"]]
    assert d["standing"]["count"] == len(standing) == 3
    assert d["standing"]["usd_per_hour"] == pytest.approx(sum(b["usd_per_hour"]
                                                              for b in standing))
    assert d["standing"]["usd_per_day"] == pytest.approx(24 * d["standing"]["usd_per_hour"])
    assert d["standing"]["roles"] == [{"role": "live", "boxes": 3, "wanted": 4}]
    assert d["standing"]["rule"] == page.RULE
    assert sum(d["totals"]["verdicts"].values()) == len(boxes)
    # money is the budget's own projection over every row, destroyed ones included
    p = budget.project(F.rows(), 60.0, now=F.NOW)
    m = d["money"]
    assert m["spent_today_usd"] == pytest.approx(p.spent_usd)
    assert m["committed_until_midnight_usd"] == pytest.approx(p.committed_usd)
    assert m["projected_day_usd"] == pytest.approx(m["spent_today_usd"]
                                                   + m["committed_until_midnight_usd"])
    assert m["headroom_usd"] == pytest.approx(60.0 - m["projected_day_usd"])
    assert m["daily_budget_usd"] == 60.0 and m["fits"] is True
    # the chart's today is the same money, counted from the same rows
    assert d["chart"]["days"][-1]["spent_usd"] == pytest.approx(m["spent_today_usd"])
    assert d["chart"]["now_usd_per_hour"] == pytest.approx(d["totals"]["usd_per_hour"])


def test_rows_are_worst_verdict_first_then_by_label() -> None:
    d = data()
    assert [(b["verdict"], b["label"]) for b in d["boxes"]] == [
        ("down", "live-vast-c3"), ("problem", "bench-runpod-f6"),
        ("problem", "live-runpod-b2"), ("well", "bench-vast-e5"), ("well", "live-vast-a1")]
    assert d["totals"]["verdicts"] == {"down": 1, "problem": 2, "unknown": 0, "well": 2}


def test_each_box_carries_its_verdict_release_and_job() -> None:
    b = by_label(data())
    a1, b2, c3 = b["live-vast-a1"], b["live-runpod-b2"], b["live-vast-c3"]
    assert a1["release"] == {"running": F.WANTED, "wanted": F.WANTED, "state": "current"}
    assert a1["behind"] is False and a1["synced"] is True and a1["blocks"] == 1_284_311
    assert a1["uptime_h"] == 77.0 and a1["checked_at"] == "2026-12-02T12:00:00Z"
    assert b2["release"] == {"running": F.OLD, "wanted": F.WANTED, "state": "behind"}
    assert b2["behind"] is True and b2["verdict"] == "problem"
    # a box its provider lists as exited: down, and the wanted release still named (the row's)
    assert c3["verdict"] == "down" and c3["problems"] == ["provider: box is exited"]
    assert c3["release"] == {"running": None, "wanted": F.WANTED, "state": "unknown"}
    assert c3["synced"] is None and c3["behind"] is None
    e5, f6 = b["bench-vast-e5"], b["bench-runpod-f6"]
    assert e5["job"] == {"name": "fma", "phase": "running", "age_min": 20.0,
                         "ttl_left_min": 40.0}
    assert e5["standing"] is False and e5["release"] is None and e5["verdict"] == "well"
    assert f6["job"]["phase"] == "finished" and f6["job"]["ttl_left_min"] == -15.0
    assert f6["gpus"] == 2 and f6["problems"][0].startswith("past its deadline")


def test_owed_entries_are_listed_with_their_reason_and_age() -> None:
    d = data()
    assert d["owed"] == [{
        "role": "live", "provider": "runpod", "card": "RTX 4090", "gpus": 1,
        "reason": "no capacity: tried 3 of 3 RTX 4090 offers on runpod; retrying every tick",
        "since": "2026-12-02T10:25:00Z", "owed_h": 1.58}]
    assert d["totals"]["owed"] == 1
    # plain mappings work too (what the loop will hand over), and none is an empty table
    d2 = data(owed=[{"role": "live", "provider": "vast", "card": "RTX 4090", "gpus": 1,
                     "reason": "over budget", "since": "2026-12-02T11:00:00Z"}])
    assert [o["reason"] for o in d2["owed"]] == ["over budget"]
    empty = data(owed=[])
    assert empty["owed"] == [] and "Nothing owed." in page.render(empty)


def test_boxes_not_checked_are_unknown_with_the_reason() -> None:
    d = data(health=[], check_error="vast GET /instances: 503 from 10.20.30.40")
    for b in d["boxes"]:
        if b["standing"]:
            assert b["verdict"] == "unknown" and b["checked_at"] is None
            assert b["problems"] == ["not checked: vast GET /instances: 503 from [address]"]
    assert d["check_error"] == "vast GET /instances: 503 from [address]"
    assert "Standing boxes not checked" in page.render(d)


def test_chart_points_for_a_known_history() -> None:
    now = F.NOW
    rows = [
        F.row("live-vast-q1", 0.25, timedelta(days=9)),  # in force when the window opens
        F.row("live-vast-q2", 1.0, timedelta(days=3), timedelta(days=1)),
        F.row("live-vast-q3", 0.5, timedelta(days=2)),
        F.row("live-vast-q4", 2.0, timedelta(days=10), timedelta(days=8)),  # before it
        F.row("live-vast-q5", 7.0, timedelta(days=2), timedelta(days=1), status="failed"),
    ]
    c = page.chart_data(rows, now)
    assert c["from"] == "2026-11-25T12:00:00Z" and c["to"] == "2026-12-02T12:00:00Z"
    assert c["steps"] == [
        {"at": "2026-11-25T12:00:00Z", "usd_per_hour": 0.25},
        {"at": "2026-11-29T12:00:00Z", "usd_per_hour": 1.25},
        {"at": "2026-11-30T12:00:00Z", "usd_per_hour": 1.75},
        {"at": "2026-12-01T12:00:00Z", "usd_per_hour": 0.75}]
    # the plot: x 70..740 over the 7 days, y 220..16 for $0.00/h..$2.00/h (the axis top)
    assert page.chart_points(c) == [
        (70.0, 194.5), (452.9, 194.5), (452.9, 92.5), (548.6, 92.5), (548.6, 41.5),
        (644.3, 41.5), (644.3, 143.5), (740.0, 143.5)]
    svg = page.chart_svg(c)
    assert ('points="70,194.5 452.9,194.5 452.9,92.5 548.6,92.5 548.6,41.5 644.3,41.5 '
            '644.3,143.5 740,143.5"') in svg
    assert 'role="img"' in svg and "<title id=\"chart-title\">" in svg and "<desc" in svg
    assert "$2.00/h" in svg and "$0.00/h" in svg  # the axis top and bottom
    days = {r["day"]: r for r in c["days"]}
    assert len(days) == 8  # the window's first and last day are partial
    assert days["2026-11-29"]["peak_usd_per_hour"] == 1.25
    assert days["2026-11-30"]["spent_usd"] == pytest.approx(12 * 1.25 + 12 * 1.75)
    assert days["2026-12-02"]["spent_usd"] == pytest.approx(12 * 0.75)
    assert days["2026-12-02"]["spent_usd"] == pytest.approx(
        budget.project(rows, 100.0, now=now).spent_usd)


def test_an_empty_history_is_a_flat_zero_line() -> None:
    c = page.chart_data([], F.NOW)
    assert c["steps"] == [{"at": "2026-11-25T12:00:00Z", "usd_per_hour": 0.0}]
    assert page.chart_points(c) == [(70.0, 220.0), (740.0, 220.0)]
    d = page.build(page.PageInputs(F.config(), [], [], [], F.NOW))
    html = page.render(d)
    assert "No live boxes." in html and d["totals"]["usd_per_hour"] == 0


def test_the_same_data_gives_the_same_bytes() -> None:
    rows = F.rows()
    one = page.build(page.PageInputs(F.config(), rows, F.health(), F.watched(), F.NOW,
                                     owed=F.owed()))
    random.Random(7).shuffle(rows)
    two = page.build(page.PageInputs(F.config(), rows, list(reversed(F.health())),
                                     list(reversed(F.watched())), F.NOW, owed=F.owed()))
    assert json.dumps(one) == json.dumps(two)
    assert page.render(one) == page.render(two) == page.render(json.loads(json.dumps(one)))


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_the_html_is_self_contained_and_semantic() -> None:
    html = page.render(data())
    p = _Tags()
    p.feed(html)
    tags = [t for t, _ in p.tags]
    assert p.tags[0] == ("html", {"lang": "en"})
    assert "script" not in tags and "iframe" not in tags and "img" not in tags
    # nothing to fetch: the only references are the JSON beside it and an empty data: icon
    refs = sorted(v or "" for _, a in p.tags for k, v in a.items() if k in ("src", "href"))
    assert refs == ["data:,", "fleet.json"]
    assert "url(" not in html and "@import" not in html
    assert re.findall(r"https?://[^\s\"'<]+", html) == ["http://www.w3.org/2000/svg"]
    assert "default-src 'none'" in html  # the CSP forbids any request the page might add
    assert tags.count("caption") == 3 and tags.count("table") == 3
    headers = [a for t, a in p.tags if t == "th"]
    assert headers and all(a.get("scope") in ("col", "row") for a in headers)


# ---------------------------------------------------------------- never on the page

def _forbidden() -> list[str]:
    out = [F.STRAY_IP]
    for host, port, ip, key in F.SECRETS.values():
        out += [host, str(port), ip, key, key.split()[1]]
    return out


def test_no_key_endpoint_or_address_reaches_either_file(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    token = "rpa_PAGETESTSECRETTOKEN0042"
    monkeypatch.setenv("RUNPOD_API_KEY", token)
    watched = F.watched()
    watched[0].problems.append(f"provider said: key {token} refused")
    d = page.build(page.PageInputs(
        F.config(), F.rows(), F.health(), watched, F.NOW, owed=F.owed(),
        check_error="ssh 203.0.113.7:47913 and 2001:db8::17 timed out"))
    page.write(tmp_path, d)
    for name in page.FILES:
        text = (tmp_path / name).read_text()
        for secret in [*_forbidden(), token]:
            assert secret not in text, f"{secret!r} in {name}"
        assert IPV4.findall(text) == [], name
        assert "ssh_host" not in text and "public_ip" not in text and "host_key" not in text
    # the JSON is an allow-list: these keys and no others
    boxes = json.loads((tmp_path / "fleet.json").read_text())["boxes"]
    assert {frozenset(b) for b in boxes} == {frozenset({
        "label", "role", "kind", "standing", "card", "gpus", "provider", "status",
        "uptime_h", "usd_per_hour", "synced", "blocks", "release", "behind", "checked_at",
        "verdict", "verdict_from", "problems", "job", "place", "place_boxes", "peers", "disk"})}


def test_the_scrubber() -> None:
    s = page.Scrubber(F.rows())
    assert s("to 203.0.113.7:47913 then 203.0.113.7") == "to [redacted] then [redacted]"
    assert s("at 10.0.0.1, ::1 and fe80::1:2") == "at [address], [address] and [address]"
    assert s("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOther0000000000000000 x") == \
        "[redacted key] x"
    # what is not an address stays: versions, times, digests
    keep = "driver 580.95.05 at 12:00:00, node 4f1c2a9be07d3351, 1.4.0"
    assert s(keep) == keep


# ---------------------------------------------------------------- `fleet page`

CONFIG = """
[fleet]
registry = "state/boxes.json"
daily_budget_usd = 50
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
"""


def fleet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "fleet.toml").write_text(CONFIG)
    # the test's own database (FLEET_DATABASE_URL, on PostgreSQL) goes with it; no other setting
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RUNPOD_", "VAST_", "FLEET_", "HF_")) or k == "FLEET_DATABASE_URL"}
    env.update(FLEET_CONFIG=str(tmp_path / "fleet.toml"), HOME=str(tmp_path), COLUMNS="200")
    return subprocess.run([sys.executable, "-c", "from fleet.cli.main import main; main()", *args],
                          cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("where", ["file", "under-a-file", "index-is-a-folder"])
def test_a_page_folder_that_cannot_be_written_is_one_line_exit_2(tmp_path: Path,
                                                                 where: str) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder\n")
    out = {"file": blocker, "under-a-file": blocker / "page",
           "index-is-a-folder": tmp_path / "page"}[where]
    if where == "index-is-a-folder":
        (out / "index.html").mkdir(parents=True)
    r = fleet(tmp_path, "page", "--out", str(out))
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: page directory {out}"), r.stderr
    assert "Traceback" not in r.stderr
    assert blocker.read_text() == "not a folder\n"
    assert not (tmp_path / "page" / "fleet.json").exists()  # nothing half-written
    assert not (tmp_path / "state").exists()


def test_fleet_page_writes_both_files_beside_the_registry(tmp_path: Path) -> None:
    # a registry of destroyed boxes only: nothing to check, so no provider (and no key) needed
    reg = Registry(tmp_path / "state" / "boxes.json")
    for r in F.rows()[5:]:
        reg.add(r)
    r = fleet(tmp_path, "page", "--json")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "state" / "page"
    doc = json.loads((out / "fleet.json").read_text())
    assert json.loads(r.stdout) == doc
    assert doc["boxes"] == [] and doc["money"]["daily_budget_usd"] == 50
    assert len(doc["chart"]["steps"]) > 1  # the destroyed boxes drew the last 7 days
    assert (out / "index.html").read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in out.iterdir()) == ["fleet.json", "index.html"]  # no temps


def _gathered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check: Any) -> Any:
    """`fleet page` in-process over the fixture's registry, with the check, the watchdog and
    the providers replaced by what they would answer."""
    from typer.testing import CliRunner

    from fleet.boxes import inventory
    from fleet.cli import common
    from fleet.cli import main as cli
    from fleet.ops import check as check_mod
    from fleet.ops import watchdog

    (tmp_path / "fleet.toml").write_text(CONFIG + "[roles.bench]\nkind = \"oneshot\"\n"
                                         "image = \"img\"\ndisk_gb = 20\n"
                                         "admitted_driver = \"580.95.05\"\n")
    reg = Registry(tmp_path / "state" / "boxes.json")
    for r in F.rows():
        reg.add(r)
    monkeypatch.setattr(common, "_state", {})
    # a key for every provider (the clients are never used: the inventory is replaced)
    monkeypatch.setattr(common, "providers", lambda: {"runpod": object(), "vast": object()})
    monkeypatch.setattr(inventory, "build", lambda c, ps: None)
    monkeypatch.setattr(check_mod, "check", check)
    monkeypatch.setattr(watchdog, "watch", lambda c, r: F.watched())
    return CliRunner().invoke(cli.app, ["--config", str(tmp_path / "fleet.toml"), "page",
                                        "--out", str(tmp_path / "out")])


def test_fleet_page_shows_the_check_and_the_watchdog(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    r = _gathered(tmp_path, monkeypatch, lambda c, built: F.health())
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "out" / "fleet.json").read_text())
    expected = data(cfg=load(tmp_path / "fleet.toml"), owed=[])  # the same rows and verdicts
    assert [(b["label"], b["verdict"], b["problems"]) for b in doc["boxes"]] == [
        (b["label"], b["verdict"], b["problems"]) for b in expected["boxes"]]
    assert doc["totals"]["usd_per_hour"] == expected["totals"]["usd_per_hour"]
    assert doc["money"]["daily_budget_usd"] == 50


def test_a_failing_check_leaves_the_standing_boxes_unknown_with_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.core.errors import ProviderError

    def check(c: Any, built: Any) -> Any:
        raise ProviderError("vast", "GET /instances", "503 from 10.9.8.7")

    r = _gathered(tmp_path, monkeypatch, check)
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "out" / "fleet.json").read_text())
    standing = [b for b in doc["boxes"] if b["standing"]]
    assert len(standing) == 3 and {b["verdict"] for b in standing} == {"unknown"}
    assert standing[0]["problems"] == ["not checked: vast GET /instances: 503 from [address]"]
    assert doc["check_error"] == "vast GET /instances: 503 from [address]"
    assert "10.9.8.7" not in (tmp_path / "out" / "index.html").read_text()


# ---------------------------------------------------------------- in a real browser

@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if executable() is None:
        pytest.fail("chromium is missing: install Debian's `chromium` package "
                    "(./run.sh setup does); the page is tested in a real browser")
    with Chromium(tmp_path_factory.mktemp("chromium")) as c:
        yield c


_ROWS_JS = """
[...document.querySelectorAll('%s tbody tr:not(.empty)')].map(tr => {
  const cells = {};
  tr.querySelectorAll('[data-th]').forEach(c => { cells[c.dataset.th] = c.innerText.trim(); });
  const pill = tr.querySelector('.status');
  return {cells, problems: [...tr.querySelectorAll('ul.problems li')].map(li => li.innerText),
          pill: pill && pill.innerText.trim(),
          colour: pill && getComputedStyle(pill).color,
          background: pill && getComputedStyle(pill).backgroundColor};
})
"""


def test_the_page_in_headless_chromium(browser: Chromium, tmp_path: Path) -> None:
    d = data()
    page.write(tmp_path / "page", d)
    url = (tmp_path / "page" / "index.html").as_uri()
    start = len(browser.events)
    browser.viewport(1280, 900)
    browser.open(url)
    assert browser.requests(start) == [url]  # the page itself, nothing else
    assert browser.console(start) == []
    assert browser.evaluate("document.documentElement.lang") == "en"
    assert browser.evaluate("document.scripts.length") == 0
    assert browser.evaluate("document.getElementById('generated-at').dateTime") == \
        d["generated_at"]

    # the boxes table is the JSON, row by row, in the same order
    rows = browser.evaluate(_ROWS_JS % "#boxes")
    assert [r["cells"]["Label"] for r in rows] == [b["label"] for b in d["boxes"]]
    for r, b in zip(rows, d["boxes"], strict=True):
        cells = r["cells"]
        assert (cells["Role"], cells["Provider"]) == (b["role"], b["provider"])
        assert cells["Card"].startswith(b["card"])
        assert cells["Standing"] == ("yes" if b["standing"] else "no")
        assert cells["USD/h"] == f"${b['usd_per_hour']:.3f}/h"
        assert cells["Up (h)"] == f"{b['uptime_h']:.1f}"
        assert r["pill"].endswith(b["verdict"]) and r["problems"] == b["problems"]
        if b["job"]:
            assert cells["Job"].startswith(b["job"]["name"]) and b["job"]["phase"] in \
                cells["Job"]
        else:
            synced, _, peers = cells["Synced"].partition("\n")
            assert synced == {True: "yes", False: "no", None: "unknown"}[b["synced"]]
            n = {k: "?" if v is None else str(v) for k, v in b["peers"].items()}
            assert peers.startswith(f"peers {n['in']} in · {n['out']} out")
            assert peers.endswith("star-only") == bool(b["peers"]["star_only"])
            assert cells["Blocks"] == ("unknown" if b["blocks"] is None
                                       else f"{b['blocks']:,}")
            assert (b["release"]["running"] or "unknown") in cells["Release"]
    # status is colour AND word, one colour per state: the rule is the same on every row
    colours: dict[str, set[tuple[str, str]]] = {}
    for r, b in zip(rows, d["boxes"], strict=True):
        colours.setdefault(b["verdict"], set()).add((r["colour"], r["background"]))
    assert all(len(c) == 1 for c in colours.values())
    assert colours["down"] == colours["problem"] != colours["well"]

    # the total under the table is the sum of the rows above it
    total = browser.evaluate("document.getElementById('total-usd-per-hour').innerText")
    assert total == f"${d['totals']['usd_per_hour']:.3f}/h"
    assert float(total[1:-2]) == pytest.approx(
        sum(float(r["cells"]["USD/h"][1:-2]) for r in rows), abs=0.0005 * len(rows))
    owed = browser.evaluate(_ROWS_JS % "#owed")
    assert [(o["cells"]["Role"], o["cells"]["Provider"], o["cells"]["Card"],
             o["cells"]["GPUs"]) for o in owed] == \
        [(o["role"], o["provider"], o["card"], str(o["gpus"])) for o in d["owed"]]
    assert all(o["reason"] in r["cells"]["Reason"] for r, o in zip(owed, d["owed"],
                                                                   strict=True))
    money = browser.evaluate("document.getElementById('money').innerText")
    for key in ("spent_today_usd", "committed_until_midnight_usd", "daily_budget_usd"):
        assert f"${d['money'][key]:,.2f}" in money
    standing = browser.evaluate("document.getElementById('standing').innerText")
    assert page.RULE in standing and f"${d['standing']['usd_per_hour']:.3f}/h" in standing

    # the chart: an image with a title, its step line, and its data table
    chart = browser.evaluate("""(() => { const s = document.querySelector('svg[role=img]');
      return {title: s.querySelector('title').textContent,
              points: s.querySelector('polyline').points.numberOfItems,
              width: s.getBoundingClientRect().width,
              days: document.querySelectorAll('#chart-data tbody tr').length}; })()""")
    assert chart["title"] == "Fleet USD/h over the last 7 days"
    assert chart["points"] == len(page.chart_points(d["chart"])) == \
        2 * len(d["chart"]["steps"])
    assert chart["width"] > 400 and chart["days"] == len(d["chart"]["days"])

    wide = browser.screenshot(tmp_path / "fleet-page.png")
    assert wide.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and wide.stat().st_size > 20_000
    if os.environ.get("FLEET_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(wide, ROOT / "docs" / "fleet-page.png")

    # a phone: no sideways scrolling, every table still there
    browser.viewport(390, 844)
    assert browser.evaluate("document.documentElement.scrollWidth <= innerWidth")
    assert browser.evaluate("document.querySelectorAll('#boxes tbody tr').length") == 5
    assert browser.evaluate("getComputedStyle(document.querySelector('#boxes thead'))"
                            ".position") == "absolute"  # the rows are cards, headers kept
    browser.screenshot(tmp_path / "fleet-page-narrow.png")
    browser.viewport(1280, 900)
    assert browser.requests(start) == [url] and browser.console(start) == []


def test_the_browser_check_sees_requests_and_console_errors(browser: Chromium,
                                                            tmp_path: Path) -> None:
    """The control: a page that asks for a remote image and logs an error is caught, so the
    page's empty lists above mean something."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html lang="en"><title>x</title>'
                   '<img src="http://fleet-page-test.invalid/x.png" alt="">'
                   '<script>console.error("boom")</script></html>')
    start = len(browser.events)
    browser.open(bad.as_uri())
    assert browser.requests(start) == [bad.as_uri(), "http://fleet-page-test.invalid/x.png"]
    assert "console.error: boom" in browser.console(start)


def test_the_page_names_each_box_s_place_and_how_many_boxes_it_holds(tmp_path: Path) -> None:
    d = page.build(page.PageInputs(F.config(), F.rows(), F.health(), F.watched(), F.NOW,
                                   owed=F.owed()))
    assert d["places"] == {"vast machine 10697": 2, "runpod data center EU-RO-1": 1}
    by = {b["label"]: (b["place"], b["place_boxes"]) for b in d["boxes"]}
    assert by["live-vast-a1"] == by["live-vast-c3"] == ("vast machine 10697", 2)
    assert by["live-runpod-b2"] == ("runpod data center EU-RO-1", 1)
    assert by["bench-vast-e5"] == (None, None)
    page.write(tmp_path, d)
    html = (tmp_path / "index.html").read_text()
    assert html.count("vast machine 10697 (2 boxes)") == 2
    assert "runpod data center EU-RO-1</span>" in html


def test_the_page_shows_each_node_s_peers_and_the_mesh(tmp_path: Path) -> None:
    d = page.build(page.PageInputs(F.config(), F.rows(), F.health(), F.watched(), F.NOW,
                                   owed=F.owed()))
    by = {b["label"]: b["peers"] for b in d["boxes"]}
    assert by["live-vast-a1"] == {"in": 2, "out": 1, "star_only": False, "port_owed": None}
    assert by["live-runpod-b2"] == {"in": 0, "out": 2, "star_only": True, "port_owed": None}
    assert by["live-vast-c3"] == {"in": None, "out": None, "star_only": None,
                                  "port_owed": None}  # unknown
    assert by["bench-vast-e5"] is None  # a one-shot box runs no node
    whole = {"in_degrees": {"0": 1, "2": 1, "unknown": 1}, "known": 2, "dialable": 1,
             "star_only": ["live-runpod-b2"], "owed_port": []}
    assert d["mesh"] == {**whole, "networks": [
        {"network": "live", "roles": ["live"], "boxes": 3, **whole}]}
    page.write(tmp_path, d)
    html = (tmp_path / "index.html").read_text()
    assert "Mesh: 1 of 2 nodes dialled by a peer (1 unknown)" in html
    assert "peers\n2 in · 1 out" in html and "peers\n? in · ? out" in html
    assert html.count("star-only") == 2  # the box's tag and the mesh line's
