"""One leader loop per fleet, on SQLite and on a real PostgreSQL server: the lead held by a real
process and taken over when it is SIGKILLed, the fence of a former leader refused by every
write that acts, a session the server ends, a standby's line, a paused leader resumed late."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import leader_loop
import psycopg
import pytest
from leader_loop import wait_for
from repo_root import ROOT

from fleet.core.boxes import Row
from fleet.core.errors import NotLeader
from fleet.ops import loop
from fleet.state import claims, last_tick, locks
from fleet.state.db import open_url
from fleet.state.leader import Fence, Leadership
from fleet.state.loop_memory import Memory
from fleet.state.registry import Registry

HOLD = """
import sys, time
from fleet.state.db import open_url
from fleet.state.leader import Leadership
lead = Leadership(open_url(sys.argv[1]), holder=sys.argv[2])
fence = lead.campaign()
print("epoch", fence.epoch if fence else None, flush=True)
while True:
    time.sleep(0.2)
    lead.lost()  # marks it seen: its seen_at moves, what a standby shows
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    got = (f"sqlite:///{tmp_path}/state/fleet.db" if request.param == "sqlite"
           else str(request.getfixturevalue("pg_url")))
    monkeypatch.setenv("FLEET_DATABASE_URL", got)
    return got


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def holder(url: str) -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    """Start a process that takes the lead as `name` and holds it; killed at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(name: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-c", HOLD, url, name], stdout=subprocess.PIPE,
                             text=True, env=env())
        started.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("epoch "), line
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def row(label: str) -> Row:
    return Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=0.3, status="running", provider_id=label)


def test_one_process_leads_and_another_is_a_standby_that_names_it(
        url: str, holder: Callable[[str], subprocess.Popen[str]]) -> None:
    holder("first")
    second = Leadership(open_url(url), holder="second")
    assert second.campaign() is None
    now = second.current()
    assert now is not None and (now.holder, now.epoch) == ("first", 1)


def test_a_leader_killed_is_followed_by_one_with_the_next_epoch(
        url: str, holder: Callable[[str], subprocess.Popen[str]]) -> None:
    first = holder("first")
    second = Leadership(open_url(url), holder="second")
    assert second.campaign() is None
    first.send_signal(signal.SIGKILL)
    first.wait()
    fence = wait_for("the second takes the lead", second.campaign)
    assert fence == Fence(2, "second")
    lead = second.current()
    assert lead is not None and (lead.holder, lead.epoch) == ("second", 2)
    second.resign()


def test_a_former_leaders_fence_is_refused_by_every_write_that_acts(
        url: str, tmp_path: Path) -> None:
    path = tmp_path / "state" / "boxes.json"
    first = Leadership(open_url(url), holder="first")
    old = first.campaign()
    assert old is not None
    Registry(path).add(row("live-a"))
    first.resign()
    second = Leadership(open_url(url), holder="second")
    assert second.campaign() == Fence(2, "second")
    stale = Registry(path, old)
    with pytest.raises(NotLeader, match="epoch 1"):
        stale.add(row("live-b"))
    with pytest.raises(NotLeader):
        stale.mark_destroyed("live-a")
    with pytest.raises(NotLeader):
        Memory(tick=9).save(path, fence=old)
    assert [r.label for r in Registry(path).rows()] == ["live-a"]
    assert Registry(path).get("live-a").destroyed_at is None  # type: ignore[union-attr]
    assert Memory.load(path).tick == 0
    Registry(path, second.fence).add(row("live-b"))  # the leader's own fence holds
    second.resign()


def _terminate_lock_session(pg: str) -> int:
    """End, from the server's side, the session holding the leader's advisory lock, and wait
    (up to 30 s) until it is gone: the server only signals the backend, which lets go of its
    locks as it exits, later on a busy machine."""
    with psycopg.connect(pg, autocommit=True) as admin:
        found = admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid::bigint = %s AND objsubid = 2", (locks.LEADER,)).fetchall()
        assert len(found) == 1, found
        ended = admin.execute("SELECT pg_terminate_backend(%s, 30000)", (found[0][0],))
        assert ended.fetchone() == (True,), "the leader's session outlived 30 s"
        return int(found[0][0])


def test_a_leader_whose_session_the_server_ends_stops_and_campaigns_with_a_new_epoch(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_DATABASE_URL", pg_url)
    leading = Leadership(open_url(pg_url), holder="me")
    made: list[Fence] = []
    ticked: list[int] = []
    said: list[str] = []

    class Ticking:
        """The loop `lead` runs: its first tick has its session ended under it."""

        def __init__(self, fence: Fence) -> None:
            self.fence = fence

        def tick(self) -> loop.Tick:
            ticked.append(self.fence.epoch)
            if self.fence.epoch == 1:
                _terminate_lock_session(pg_url)
                return loop.Tick(1, "now")
            raise KeyboardInterrupt  # the new leader's first tick: the test has seen enough

    def make(fence: Fence) -> Any:
        made.append(fence)
        return Ticking(fence)

    with pytest.raises(KeyboardInterrupt):
        loop.lead(leading, make, 0.01, False, lambda _t: None, said.append, poll_s=0.01)
    assert [f.epoch for f in made] == [1, 2]
    assert ticked == [1, 2]  # the first loop never ticked again
    assert any(s.startswith("lost the lead") and "session dropped" in s for s in said), said
    leading.resign()


def test_a_leader_whose_session_ended_acts_no_more_though_no_one_took_over(
        pg_url: str, tmp_path: Path) -> None:
    leading = Leadership(open_url(pg_url), holder="me")
    fence = leading.campaign()
    assert fence is not None
    reg = Registry(tmp_path / "boxes.json", db=open_url(pg_url)).fenced(fence)
    _terminate_lock_session(pg_url)  # no other loop campaigns: the epoch in the row is its own
    with pytest.raises(NotLeader, match="session"):
        reg.add(Row("live-a", "vast", "live", "standing", "RTX 4090", 1, 0.3))
    assert reg.rows() == []
    leading.resign()


def test_lost_says_the_session_the_server_ended(pg_url: str) -> None:
    leading = Leadership(open_url(pg_url), holder="me")
    assert leading.campaign() is not None and leading.lost() is None
    _terminate_lock_session(pg_url)
    why = leading.lost()
    assert why is not None and "session dropped" in why
    assert leading.fence is None


def test_a_standbys_fleet_loop_says_once_whose_loop_leads(
        url: str, tmp_path: Path, holder: Callable[[str], subprocess.Popen[str]]) -> None:
    from sandbox.daemon import Sandbox

    first = holder("the first machine")
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[fleet]\nregistry = "{tmp_path}/state/boxes.json"\n'
                   "daily_budget_usd = 10\n")
    with Sandbox(seed=7, boot_delay=0.2, poll_interval=0.01) as sbx:
        e = {**env(), **sbx.env(), "HOME": str(tmp_path), "FLEET_CONFIG": str(cfg)}
        standby = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli.main", "loop", "--interval", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=tmp_path)
        try:
            assert standby.stderr is not None
            lines: list[str] = []
            while not any(ln.startswith("standby:") for ln in lines):
                line = standby.stderr.readline()
                assert line, f"the standby ended: {lines}"
                lines.append(line)
            first.send_signal(signal.SIGKILL)  # it takes over at a later poll, not the first
            first.wait()
            while not any(ln.startswith("leading as") for ln in lines):
                line = standby.stderr.readline()
                assert line, f"the standby ended: {lines}"
                lines.append(line)
        finally:
            standby.kill()
            standby.wait()
    said = [ln for ln in lines if ln.startswith("standby:")]
    assert len(said) == 1, lines
    assert said[0].startswith("standby: the loop of the first machine (epoch 1, leading since")
    assert "(epoch 2)" in lines[-1], lines


def test_a_paused_leader_resumed_after_a_takeover_rents_nothing(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGSTOPped between its tick's last save and its rent while the server ended its
    session and another loop took over: resumed, its rent is refused (NotLeader) before the
    provider is asked."""
    monkeypatch.setenv("FLEET_DATABASE_URL", pg_url)
    folder = leader_loop.prepare(tmp_path / "fleet")
    gate = tmp_path / "go"
    paused = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/unit/leader_loop.py"), str(folder), pg_url, "tick"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**env(), "PAUSE_IN_OFFERS": str(gate)})
    try:
        wait_for("the leader asks for offers",
                 lambda: any(e["op"] == "offers" for e in leader_loop.events(folder)))
        paused.send_signal(signal.SIGSTOP)
        _terminate_lock_session(pg_url)
        other = Leadership(open_url(pg_url), holder="other")
        assert wait_for("the other takes the lead", other.campaign) == Fence(2, "other")
        gate.touch()
        paused.send_signal(signal.SIGCONT)
        out, _ = paused.communicate(timeout=120)
    finally:
        if paused.poll() is None:
            paused.kill()
            paused.wait()
    assert paused.returncode == 3, out
    assert "NotLeader: this loop (epoch 1) no longer leads (now epoch 2, other)" in out, out
    assert [e["op"] for e in leader_loop.events(folder)] == ["offers"]  # no create
    assert Registry(folder / "state" / "boxes.json").rows() == []
    other.resign()


def test_a_former_leaders_tick_stops_at_its_first_refused_destroy(
        url: str, tmp_path: Path) -> None:
    """A refused destroy is NotLeader out of the tick, never "failed, tried again next tick"
    with the tick going on to check the boxes and act on what it sees."""
    folder = leader_loop.prepare(tmp_path / "fleet")
    path = folder / "state" / "boxes.json"
    vast = leader_loop.FileVast(folder)
    box = vast.rent(None, type("Req", (), {"label": "live-x"})())
    r = row("live-x")
    r.provider_id, r.destroy_wanted = box.box_id, "over budget at the listed price"
    Registry(path).add(r)
    standing = vast.rent(None, type("Req", (), {"label": "live-y"})())
    Registry(path).add(Row(label="live-y", provider="vast", role="live", kind="standing",
                           card="RTX 4090", gpu_count=1, usd_per_hour=0.2, status="running",
                           provider_id=standing.box_id, host_key="ssh-ed25519 AAAA",
                           ssh_host="10.0.0.1", ssh_port=22, standing=True))
    first = Leadership(open_url(url), holder="first")
    old = first.campaign()
    first.resign()
    second = Leadership(open_url(url), holder="second")
    assert second.campaign() is not None
    stale = leader_loop.make_loop(folder, old)
    checked: list[Any] = []
    stale.check_fn = lambda _cfg, built: checked.append(built) or []
    with pytest.raises(NotLeader, match="epoch 1"):
        stale.tick()
    assert checked == []  # it stopped there: no box was checked
    assert [e["op"] for e in leader_loop.events(folder)] == ["create"] * 2  # none destroyed
    assert Registry(path).get("live-x").destroyed_at is None  # type: ignore[union-attr]
    second.resign()


def test_a_former_leader_changes_no_row_and_records_no_tick(pg_url: str, tmp_path: Path) -> None:
    """Its session ended and another leads: none of its writes lands, whichever path it takes
    (an update giving up a rent would free the slot for a second box)."""
    db = open_url(pg_url)
    first = Leadership(db, holder="first")
    fence = first.campaign()
    assert fence is not None
    path = tmp_path / "boxes.json"
    old = Registry(path, db=db).fenced(fence)
    old.add(Row("n1", "vast", "live", "standing", "RTX 4090", 1, 0.3, slot="live/vast/x/1#0"))
    _terminate_lock_session(pg_url)
    second = Leadership(open_url(pg_url), holder="second")
    assert wait_for("the second takes the lead", second.campaign) is not None
    before = Registry(path, db=db).rows()
    for write in (lambda: old.update("n1", status="failed", destroyed_at="2026-12-05T00:00:00Z"),
                  lambda: old.update_many({"n1": {"provider_id": "7"}}),
                  lambda: old.transaction().__enter__(),
                  lambda: last_tick.save(path, 9, "2026-12-05T00:00:00Z", [], fence=fence),
                  lambda: claims.post(db, 9, [("n1", {})], fence=fence)):
        with pytest.raises(NotLeader):
            write()
    assert Registry(path, db=db).rows() == before
    assert last_tick.load(path) is None
    second.resign()


def test_a_loop_that_lost_the_lead_after_writing_its_row_makes_no_create(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row is written under the fence; the lead lost before the provider is asked: no box
    (the new leader finds the row unfinished, and no box under its label)."""
    from fleet.ops import rent as rent_mod

    monkeypatch.setenv("FLEET_DATABASE_URL", pg_url)
    folder = leader_loop.prepare(tmp_path / "fleet")
    leading = Leadership(open_url(pg_url), holder="me")
    fence = leading.campaign()
    assert fence is not None
    added = rent_mod._add_row

    def add_then_lose(*a: Any, **k: Any) -> Row:
        row = added(*a, **k)
        _terminate_lock_session(pg_url)
        return row

    monkeypatch.setattr(rent_mod, "_add_row", add_then_lose)
    with pytest.raises(NotLeader):
        leader_loop.make_loop(folder, fence).tick()
    assert [e["op"] for e in leader_loop.events(folder)] == ["offers"]  # no create
    rows = Registry(folder / "state" / "boxes.json").rows()
    assert [(r.status, r.provider_id) for r in rows] == [("renting", None)]  # the new leader's
    leading.resign()


def test_two_paths_to_one_sqlite_file_share_one_lead(tmp_path: Path) -> None:
    real = tmp_path / "data" / "fleet.db"
    real.parent.mkdir()
    first = Leadership(open_url(f"sqlite:///{real}"), holder="first")
    assert first.campaign() is not None
    (tmp_path / "fleet.db").symlink_to(real)
    second = Leadership(open_url(f"sqlite:///{tmp_path / 'fleet.db'}"), holder="second")
    assert second.campaign() is None
    first.resign()


def test_a_loop_whose_database_goes_away_waits_for_it_and_leads_again() -> None:
    """The server stops under the leader's tick: the loop says so and campaigns until it is
    back, then leads with a new epoch; it never exits for it."""
    import pgserver

    with pgserver.running() as server:
        url = server.url(pgserver.create_database(server))
        leading = Leadership(open_url(url), holder="me")
        ticked: list[int] = []
        said: list[str] = []

        class Ticking:
            def __init__(self, fence: Fence) -> None:
                self.fence = fence

            def tick(self) -> loop.Tick:
                ticked.append(self.fence.epoch)
                if len(ticked) == 1:
                    pgserver.stop(server)  # the database goes away mid-tick
                    return loop.Tick(1, "now")
                raise KeyboardInterrupt  # the loop leads again: seen enough

        def say(line: str) -> None:
            said.append(line)
            if "did not answer" in line and len(said) < 100:
                pgserver.restart(server)  # back after one failed campaign

        with pytest.raises(KeyboardInterrupt):
            loop.lead(leading, Ticking, 0.01, False, lambda _t: None, say, poll_s=0.01)
        leading.resign()
    assert ticked == [1, 2], said
    assert any("did not answer" in s for s in said), said
