"""The loop's last tick (the state database's `ticks` and `tick_health`): saved whole by the
loop's after-tick hook, read back as it was, whole even when its writer is killed mid-save, and
never a crash (nor a box without problems) when it is missing or its stored rows are damaged;
the stale rule."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import page_fixture as F
import pytest
from state_fixture import sql

from fleet.cli.loop_cmd import page_after_tick
from fleet.core import config
from fleet.core.times import read_iso
from fleet.core.verdicts import Health, Owed
from fleet.ops.loop import Loop, Tick
from fleet.state import last_tick
from fleet.state.db import open_db
from fleet.state.registry import Registry

AT = "2026-12-02T11:48:00Z"


def full_health() -> Health:
    """A Health with every field set, so a field from_dict does not know would show."""
    return Health("live-vast-a1", "vast", ssh=True, agent=True, synced=True, blocks=12,
                  exec_tip=11, exec_moving=True, prover="proving", admitted=True,
                  admission_reason="ok", node_sha16=F.WANTED, wanted_sha16=F.WANTED,
                  problems=[])


def test_save_and_load_give_back_the_tick(tmp_path: Path) -> None:
    reg = tmp_path / "state" / "boxes.json"
    health = [full_health(), *F.health()[1:]]
    saved = last_tick.save(reg, 42, AT, health, F.owed(), ["vast list: HTTP 503"],
                           now=F.NOW)
    back = last_tick.load(reg)
    assert back == saved
    assert back.number == 42 and back.at == AT and back.saved_at == "2026-12-02T12:00:00Z"
    assert list(back.health) == health and list(back.owed) == F.owed()
    assert back.provider_errors == ("vast list: HTTP 503",)
    assert back.verdict("live-runpod-b2") == F.health()[1]
    assert back.verdict("no-such-box") is None
    # a row per box judged, in order, each its Health's document
    stored = sql(reg, "SELECT label, doc FROM tick_health WHERE number = 42 ORDER BY pos")
    assert [label for label, _ in stored] == [h.label for h in health]
    assert json.loads(stored[0][1])["well"] is True
    assert not (tmp_path / "state" / "last_tick.json").exists()


def test_a_second_save_replaces_the_first_whole(tmp_path: Path) -> None:
    reg = tmp_path / "state" / "boxes.json"
    last_tick.save(reg, 41, AT, F.health(), F.owed(), now=F.NOW)
    saved = last_tick.save(reg, 42, AT, F.health()[:1], now=F.NOW)
    assert last_tick.load(reg) == saved
    assert sql(reg, "SELECT number FROM ticks") == [(42,)]
    assert sql(reg, "SELECT DISTINCT number FROM tick_health") == [(42,)]  # no older rows


def test_no_tick_yet_is_none(tmp_path: Path) -> None:
    assert last_tick.load(tmp_path / "state" / "boxes.json") is None


def _killed_saving(registry: str, inside: str) -> None:
    """Saves tick 43 in a write transaction and stalls before its commit."""
    tick = last_tick.LastTick(43, AT, tuple(F.health()[:1]), saved_at=AT)
    with open_db(Path(registry)).write() as tx:
        last_tick.save_in(tx, tick)
        Path(inside).touch()
        time.sleep(60)


def test_a_saver_killed_mid_save_leaves_the_tick_before_it_whole(tmp_path: Path) -> None:
    reg = tmp_path / "state" / "boxes.json"
    saved = last_tick.save(reg, 42, AT, F.health(), F.owed(), now=F.NOW)
    inside = tmp_path / "inside"
    saver = multiprocessing.get_context("fork").Process(target=_killed_saving,
                                                         args=(str(reg), str(inside)))
    saver.start()
    deadline = time.monotonic() + 30
    while not inside.exists():
        assert time.monotonic() < deadline, "the saver never got inside its transaction"
        assert saver.exitcode is None, f"the saver ended first: {saver.exitcode}"
        time.sleep(0.01)
    assert last_tick.load(reg) == saved  # a reader meanwhile: the tick before, whole
    os.kill(saver.pid or 0, signal.SIGKILL)
    saver.join()
    assert last_tick.load(reg) == saved
    again = last_tick.save(reg, 44, AT, F.health()[1:], now=F.NOW)  # the next writer proceeds
    assert last_tick.load(reg) == again


def _edit_health(reg: Path, pos: int, change: Any) -> None:
    (doc,) = sql(reg, "SELECT doc FROM tick_health WHERE pos = ?", (pos,))
    d = json.loads(doc[0])
    change(d)
    sql(reg, "UPDATE tick_health SET doc = ? WHERE pos = ?", (json.dumps(d), pos))


def _edit_owed(reg: Path, change: Any) -> None:
    (owed,) = sql(reg, "SELECT owed FROM ticks")
    d = json.loads(owed[0])
    change(d)
    sql(reg, "UPDATE ticks SET owed = ?", (json.dumps(d),))


DAMAGES: dict[str, Any] = {
    "health not json": lambda reg: sql(reg, "UPDATE tick_health SET doc = '{not json'"),
    "health truncated": lambda reg: sql(reg, "UPDATE tick_health SET doc = substr(doc, 1, 40)"
                                        " WHERE pos = 1"),
    "health a list": lambda reg: sql(reg, "UPDATE tick_health SET doc = '[]' WHERE pos = 0"),
    "health a number": lambda reg: sql(reg, "UPDATE tick_health SET doc = '7' WHERE pos = 0"),
    "health without a label": lambda reg: _edit_health(reg, 0, lambda d: d.pop("label")),
    # read as "no problems", it would be a well box
    "problems null": lambda reg: _edit_health(reg, 1, lambda d: d.update(problems=None)),
    "problems not texts": lambda reg: _edit_health(reg, 1, lambda d: d.update(problems=[1, 2])),
    "ssh is text": lambda reg: _edit_health(reg, 0, lambda d: d.update(ssh="yes")),
    "time unreadable": lambda reg: sql(reg, "UPDATE ticks SET at = 'yesterday'"),
    "owed not json": lambda reg: sql(reg, "UPDATE ticks SET owed = '[{'"),
    "owed not a list": lambda reg: sql(reg, "UPDATE ticks SET owed = '7'"),
    "owed gpus text": lambda reg: _edit_owed(reg, lambda d: d[0].update(gpus="1")),
    "owed without reason": lambda reg: _edit_owed(reg, lambda d: d[0].pop("reason")),
    "errors not texts": lambda reg: sql(reg, "UPDATE ticks SET provider_errors = '[null]'"),
    "errors not json": lambda reg: sql(reg, "UPDATE ticks SET provider_errors = 'HTTP 503'"),
    "deeply nested": lambda reg: sql(reg, "UPDATE tick_health SET doc = ? WHERE pos = 0",
                                     ("[" * 200000,)),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_tick_is_none_never_an_error(tmp_path: Path, damage: str) -> None:
    reg = tmp_path / "boxes.json"
    last_tick.save(reg, 42, AT, F.health(), F.owed(), now=F.NOW)
    assert last_tick.load(reg) is not None
    DAMAGES[damage](reg)
    assert last_tick.load(reg) is None


def test_health_from_dict_rederives_well_and_refuses_wrong_types() -> None:
    h = full_health()
    assert Health.from_dict(h.to_dict()) == h
    # `well` is never read: a file saying well with problems is a box with problems
    d = F.health()[1].to_dict() | {"well": True}
    back = Health.from_dict(d)
    assert back.well is False and back.problems == F.health()[1].problems
    with pytest.raises(ValueError, match="provider"):
        Health.from_dict({"label": "x"})
    with pytest.raises(ValueError, match="problems"):
        Health.from_dict({"label": "x", "provider": "vast", "ssh": True, "agent": True,
                          "problems": None})
    with pytest.raises(ValueError, match="blocks"):
        Health.from_dict({"label": "x", "provider": "vast", "ssh": True, "agent": True,
                          "problems": [], "blocks": "12"})
    # a partial or hand-edited entry never reads as a box without problems
    with pytest.raises(ValueError, match="problems"):
        Health.from_dict({"label": "x", "provider": "vast", "ssh": True, "agent": True})
    with pytest.raises(ValueError, match="SSH or its agent is down"):
        Health.from_dict({"label": "x", "provider": "vast", "ssh": False, "agent": False,
                          "problems": [], "well": False})


@pytest.mark.parametrize(("age_s", "stale"), [
    (0, False), (119, False), (120, False), (121, True), (3600, True),
    (-30, False),  # a little ahead of this clock: machines' clocks differ
    (-61, True),  # more than an interval ahead: cannot be trusted
])
def test_a_tick_older_than_two_intervals_is_stale(age_s: float, stale: bool) -> None:
    tick = last_tick.LastTick(1, AT)
    now = datetime(2026, 12, 2, 11, 48, tzinfo=UTC) + timedelta(seconds=age_s)
    assert tick.age_s(now) == age_s
    assert tick.stale(now, interval_s=60) is stale


# ---------------------------------------------------------------- the loop's hook

TOML = """
[fleet]
registry = "{tmp}/state/boxes.json"
ssh_key = "{tmp}/state/ssh/fleet"
daily_budget_usd = 100
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
"""


def _config(tmp_path: Path) -> config.Config:
    return config.parse(tomllib.loads(TOML.format(tmp=tmp_path)), tmp_path / "fleet.toml")


def test_the_loop_hook_saves_the_tick_then_writes_the_page(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    reg = Registry(cfg.registry)
    for r in F.rows()[:3]:  # the standing boxes
        reg.add(r)
    owe = Owed("live", "runpod", "RTX 4090", 1, "2026-12-02T10:25:00Z", "no capacity",
              rerent_of="live-runpod-old")
    t = Tick(42, AT, owed=[owe], provider_errors=["runpod list: HTTP 503"])
    page_after_tick(cfg, tmp_path / "page")(t, F.health())
    saved = last_tick.load(cfg.registry)
    assert saved is not None
    assert (saved.number, saved.at) == (42, AT)
    assert list(saved.health) == F.health()
    assert saved.owed == (Owed("live", "runpod", "RTX 4090", 1,
                               reason="no capacity (replaces live-runpod-old)",
                               since="2026-12-02T10:25:00Z"),)
    assert saved.provider_errors == ("runpod list: HTTP 503",)
    assert read_iso(saved.saved_at) is not None
    page = json.loads((tmp_path / "page" / "fleet.json").read_text())
    # the loop's own page is live: its verdicts are this tick's, checked now
    assert page["sources"]["note"] is None
    assert page["sources"]["standing_verdicts"]["from"] == "live"
    assert {b["verdict_from"] for b in page["boxes"]} == {"live"}
    assert [o["reason"] for o in page["owed"]] == ["no capacity (replaces live-runpod-old)"]


def test_a_loop_tick_leaves_its_last_tick(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    cfg.ssh_key.parent.mkdir(parents=True)
    cfg.ssh_key.write_text("a key\n")
    cfg.ssh_key.with_suffix(".pub").write_text("ssh-ed25519 AAAA fleet\n")

    def converge(_cfg: Any, labels: list[str]) -> None:
        raise AssertionError(f"nothing to converge: {labels}")

    loop = Loop(cfg, {}, after_tick=page_after_tick(cfg, tmp_path / "page"),
                echo=lambda _: None, check_fn=lambda *_: [], converge_fn=converge)
    for n in (1, 2):
        t = loop.tick()
        saved = last_tick.load(cfg.registry)
        assert saved is not None and (saved.number, saved.at) == (n, t.started_at)
        assert saved.health == () and saved.owed == ()
        assert not any(a.startswith("page: ") for a in t.actions), t.actions


def test_a_healths_dict_is_asdicts_and_its_own() -> None:
    """`Health.to_dict` builds the JSON shapes itself (asdict's deep copy of every peer was most
    of what saving a tick cost): the same dict as `dataclasses.asdict`, sharing no list or
    object with the Health, and asdict's own way for anything else."""
    from dataclasses import asdict, dataclass

    h = full_health()
    h.problems = ["node: not synced"]
    h.peers_in, h.peers_out = 2, 3
    h.peer_list = [{"dir": "in", "remote": "10.0.0.2:16111", "public": True,
                    "extra": {"rtt_ms": [1.5, None], "n": 1}}]
    d = h.to_dict()
    assert d == {**asdict(h), "well": False}
    assert list(d) == [*asdict(h), "well"]
    d["problems"].append("more")
    d["peer_list"][0]["extra"]["rtt_ms"].append(2)
    d["peer_list"].append({})
    assert h.problems == ["node: not synced"] and len(h.peer_list) == 1
    assert h.peer_list[0]["extra"]["rtt_ms"] == [1.5, None]

    @dataclass
    class Peer:
        remote: str

    for odd in ((1, 2), Peer("10.0.0.3:1"), Path("/x")):  # not JSON's own: asdict's way
        h.peer_list = [{"odd": odd}]
        assert h.to_dict() == {**asdict(h), "well": False}
        assert h.to_dict()["peer_list"][0]["odd"] == asdict(h)["peer_list"][0]["odd"]
