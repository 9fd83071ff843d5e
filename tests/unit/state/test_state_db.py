"""The fleet's state database: its numbered migrations (each once, also when two processes start
at once; a newer database refused), the refusal of an older fleet's JSON files beside an empty
database, `fleet state import` (all or nothing, read back, the files kept byte for byte), the
schema's own uniqueness (refused by the database, whatever code wrote the row) and the leader's
fence."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
from cli_fixture import fleet
from state_fixture import database, dump, is_postgres, sql

from fleet.core.boxes import Row
from fleet.core.errors import NotLeader, StateError, UsageError
from fleet.state import bills, last_tick, schema
from fleet.state.db import Duplicate, LegacyState, migrate, open_db, open_url, url_for, version
from fleet.state.leader import Fence, Leadership
from fleet.state.loop_memory import Memory
from fleet.state.registry import Registry, columns


def row(label: str, **kw: Any) -> Row:
    base: dict[str, Any] = dict(provider="vast", role="live", kind="standing", card="RTX 4090",
                                gpu_count=1, usd_per_hour=0.4)
    base.update(kw)
    return Row(label=label, **base)


def insert(registry: Path, r: Row, seq: int) -> None:
    """`r` written with SQL, past the Registry and its checks."""
    sql(registry, "INSERT INTO boxes (provider, provider_id, slot, rerent_of, move_of, live, "
        "doc, label, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (*columns(r), r.label, seq))


# --- migrations ----------------------------------------------------------------------------

def test_migrations_are_numbered_and_each_applied_once(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    db = open_db(reg)
    assert version(db) == 0  # nothing yet: the first transaction migrates
    assert Registry(reg).rows() == []
    assert version(db) == schema.LATEST
    assert [n for n, _, _ in schema.MIGRATIONS] == list(range(1, schema.LATEST + 1))
    applied = sql(reg, "SELECT version, name FROM schema_migrations ORDER BY version")
    assert applied == [(n, name) for n, name, _ in schema.MIGRATIONS]
    assert migrate(db) == schema.LATEST  # again: nothing left to apply
    assert sql(reg, "SELECT COUNT(*) FROM schema_migrations") == [(schema.LATEST,)]


def test_a_database_of_a_newer_fleet_is_refused_in_one_line(tmp_path: Path) -> None:
    reg = tmp_path / "state" / "boxes.json"
    Registry(reg).add(row("a-1"))
    sql(reg, "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'x', 'now')",
        (schema.LATEST + 1,))
    before = dump(reg)
    r = fleet(tmp_path, "state", "show")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"schema version {schema.LATEST + 1} is newer than this fleet's {schema.LATEST}" \
        in r.stderr and "Traceback" not in r.stderr
    assert dump(reg) == before  # nothing changed


def _migrate_at_once(url: str, start: Any) -> None:
    start.wait(30)
    assert migrate(open_url(url)) == schema.LATEST


def test_two_processes_migrating_at_once_both_succeed(tmp_path: Path) -> None:
    url = url_for(tmp_path / "boxes.json")
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(4)
    procs = [ctx.Process(target=_migrate_at_once, args=(url, start)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    with open_url(url).read() as tx:
        assert tx.q("SELECT version FROM schema_migrations ORDER BY version") == \
            [(n,) for n in range(1, schema.LATEST + 1)]


# --- an older fleet's files --------------------------------------------------------------

def legacy(folder: Path) -> dict[str, bytes]:
    """The five JSON files of an older fleet in `folder`: their bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    boxes = [row("live-abc123-vast-000001", provider_id="11", status="running",
                 created_at="2026-12-03T00:00:00Z").to_dict(),
             row("live-abc123-vast-000002", provider_id="12", status="destroyed",
                 created_at="2026-12-02T00:00:00Z",
                 destroyed_at="2026-12-02T10:00:00Z").to_dict()]
    docs = {
        "boxes.json": {"schema": 1, "fleet_id": "abc123", "boxes": boxes},
        "loop.json": {"tick": 7, "dead": {"live-abc123-vast-000001": 1}, "rerents": [],
                      "owed": [], "orphans": {}},
        "bills.json": {"read_at": "2026-12-03T12:00:00Z", "since": "2026-12-03T00:00:00Z",
                       "charges": {"vast": {"11": 1.5}}, "errors": {}, "covered": {}},
        "last_tick.json": {"schema": 1, "number": 7, "at": "2026-12-03T11:59:00Z",
                           "saved_at": "2026-12-03T11:59:30Z", "owed": [],
                           "provider_errors": ["runpod list: HTTP 503"],
                           "health": [{"label": "live-abc123-vast-000001", "provider": "vast",
                                       "ssh": True, "agent": True, "problems": []}]},
        "check-history.json": {"live-abc123-vast-000001": {"exec_tip": 12, "at": 1.0}},
    }
    for name, d in docs.items():
        (folder / name).write_text(json.dumps(d, indent=2))
    return {name: (folder / name).read_bytes() for name in docs}


def test_the_json_files_of_an_older_fleet_beside_an_empty_database_are_refused(
        tmp_path: Path) -> None:
    reg = tmp_path / "state" / "boxes.json"
    legacy(reg.parent)
    with pytest.raises(LegacyState, match="run `fleet state import` first"):
        Registry(reg)
    r = fleet(tmp_path, "roster")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "run `fleet state import` first" in r.stderr


def test_state_import_moves_every_file_in_reads_it_back_and_keeps_the_files(
        tmp_path: Path) -> None:
    reg = tmp_path / "state" / "boxes.json"
    files = legacy(reg.parent)
    r = fleet(tmp_path, "state", "import")
    assert r.returncode == 0, r.stderr
    assert "imported 2 rows, the loop's memory, the last bills, the last tick (1 boxes), " \
        "the check history (1 boxes)" in r.stdout
    assert {n: (reg.parent / n).read_bytes() for n in files} == files  # byte for byte
    got = {r.label: r.to_dict() for r in Registry(reg).rows()}
    assert got == {d["label"]: Row(**d).to_dict()
                   for d in json.loads(files["boxes.json"])["boxes"]}
    assert Registry(reg).fleet_id() == "abc123"
    assert Memory.load(reg).dead == {"live-abc123-vast-000001": 1}
    saved = bills.load(reg)
    assert saved is not None and saved.charges == {"vast": {"11": 1.5}}
    tick = last_tick.load(reg)
    assert tick is not None and tick.number == 7 and tick.provider_errors == (
        "runpod list: HTTP 503",)
    from fleet.state import check_history
    assert check_history.load(reg) == {"live-abc123-vast-000001": {"exec_tip": 12, "at": 1.0}}
    before = dump(reg)
    again = fleet(tmp_path, "state", "import")  # a second import changes nothing
    assert again.returncode == 0 and "(2 already there)" in again.stdout, again.stderr
    assert dump(reg) == before
    assert {n: (reg.parent / n).read_bytes() for n in files} == files


def test_a_second_import_never_puts_back_what_the_fleet_changed_since(tmp_path: Path) -> None:
    reg = tmp_path / "state" / "boxes.json"
    legacy(reg.parent)
    assert fleet(tmp_path, "state", "import").returncode == 0
    Memory(tick=8).save(reg)  # the loop ran since
    before = dump(reg)
    r = fleet(tmp_path, "state", "import")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "loop.json" in r.stderr and "nothing imported" in r.stderr
    assert dump(reg) == before and Memory.load(reg).tick == 8


@pytest.mark.parametrize(("name", "text"), [
    ("boxes.json", '{"schema": 1, "boxes": ['),
    ("loop.json", "{not json"),
    ("bills.json", "[1, 2"),
    ("last_tick.json", '{"schema": 1, "health": ' + "[" * 200000),
    ("check-history.json", "\x00\x01"),
    ("boxes.json", '{"schema": 2, "boxes": []}'),
    ("boxes.json", '{"schema": 1, "boxes": [{"label": "x", "colour": "red"}]}'),
    ("loop.json", '{"tick": "seven"}'),
    ("bills.json", '{"charges": {}}'),
    ("last_tick.json", '{"schema": 1, "number": "7"}'),
])
def test_a_corrupt_file_imports_nothing_and_is_kept(tmp_path: Path, name: str,
                                                    text: str) -> None:
    reg = tmp_path / "state" / "boxes.json"
    files = legacy(reg.parent)
    (reg.parent / name).write_text(text)
    files[name] = (reg.parent / name).read_bytes()
    r = fleet(tmp_path, "state", "import")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert name in r.stderr and "nothing imported" in r.stderr, r.stderr
    assert {n: (reg.parent / n).read_bytes() for n in files} == files
    with database(reg).read() as tx:  # past the legacy refusal
        for table in ("boxes", "meta", "docs", "ticks", "tick_health", "check_history"):
            assert tx.q(f"SELECT * FROM {table}") == [], table


@pytest.mark.parametrize("make", [os.mkfifo, lambda p: p.symlink_to("/dev/zero")])
def test_a_file_that_is_not_a_regular_one_is_refused_never_read_forever(
        tmp_path: Path, make: Any) -> None:
    reg = tmp_path / "state" / "boxes.json"
    legacy(reg.parent)
    (reg.parent / "last_tick.json").unlink()
    make(reg.parent / "last_tick.json")
    r = fleet(tmp_path, "state", "import")  # within the helper's timeout
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "last_tick.json: not a regular file; nothing imported" in r.stderr


def test_an_import_into_a_database_holding_other_rows_is_refused(tmp_path: Path) -> None:
    reg = tmp_path / "state" / "boxes.json"
    Registry(reg).add(row("live-other-1", provider_id="99"))
    before = dump(reg)
    files = legacy(reg.parent)
    r = fleet(tmp_path, "state", "import")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "already holds 1 other rows; nothing imported" in r.stderr
    assert dump(reg) == before
    assert {n: (reg.parent / n).read_bytes() for n in files} == files


def test_an_import_from_a_folder_without_the_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    r = fleet(tmp_path, "state", "import", "--from", str(tmp_path / "empty"))
    assert r.returncode == 2 and "none of boxes.json" in r.stderr, r.stderr


# --- the schema's uniqueness, whoever writes ----------------------------------------------

@pytest.mark.parametrize(("first", "second", "columns"), [
    (dict(slot="live/vast/RTX 4090/1#1"), dict(slot="live/vast/RTX 4090/1#1"), "boxes.slot"),
    (dict(rerent_of="live-dead-1"), dict(rerent_of="live-dead-1"), "boxes.rerent_of"),
    (dict(move_of="live-moved-1"), dict(move_of="live-moved-1"), "boxes.move_of"),
    (dict(provider_id="31"), dict(provider_id="31"), "boxes.provider, boxes.provider_id"),
    # a provider id is one box's for ever: a dead row's id is never a new box's
    (dict(provider_id="31", status="destroyed", destroyed_at="2026-12-01T00:00:00Z"),
     dict(provider_id="31"), "boxes.provider, boxes.provider_id"),
])
def test_the_database_refuses_a_second_row_for_what_one_may_hold_in_the_same_words_on_both(
        tmp_path: Path, first: dict[str, Any], second: dict[str, Any], columns: str) -> None:
    reg = tmp_path / "boxes.json"
    insert(reg, row("a-1", **first), 1)
    before = dump(reg)
    with pytest.raises(Duplicate) as refused:
        insert(reg, row("a-2", **second), 2)
    assert str(refused.value) == f"the database refused it: a second row with the same {columns}"
    assert dump(reg) == before


def test_a_second_row_for_a_label_is_refused_in_the_same_words_on_both(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    insert(reg, row("a-1"), 1)
    with pytest.raises(Duplicate) as refused:
        insert(reg, row("a-1"), 2)
    assert str(refused.value) == "the database refused it: a second row with the same boxes.label"


@pytest.mark.parametrize("held", [dict(slot="live/vast/RTX 4090/1#1"),
                                  dict(rerent_of="live-dead-1"), dict(move_of="live-moved-1")])
def test_a_dead_rows_slot_replacement_or_move_is_free_again(tmp_path: Path,
                                                            held: dict[str, Any]) -> None:
    reg = tmp_path / "boxes.json"
    insert(reg, row("a-1", status="destroyed", destroyed_at="2026-12-01T00:00:00Z", **held), 1)
    insert(reg, row("a-2", **held), 2)
    assert [r.label for r in Registry(reg).live_rows()] == ["a-2"]


def test_a_registry_add_for_a_taken_slot_is_one_line_and_writes_nothing(
        tmp_path: Path) -> None:
    reg = Registry(tmp_path / "boxes.json")
    reg.add(row("a-1", slot="live/vast/RTX 4090/1#1"))
    before = dump(reg.path)
    with pytest.raises(UsageError, match="a-2: not rented: slot live/vast/RTX 4090/1#1 already "
                       "holds a live box"):
        reg.add(row("a-2", slot="live/vast/RTX 4090/1#1"))
    assert dump(reg.path) == before


# --- the leader's fence --------------------------------------------------------------------

def test_a_stale_epoch_is_refused_by_the_fence(tmp_path: Path) -> None:
    db = open_db(tmp_path / "boxes.json")
    with pytest.raises(NotLeader, match="now none"):
        with db.write() as tx:
            Fence(1, "first").check(tx)  # no leader yet
    first = Leadership(db, holder="first")
    old = first.campaign()
    assert old is not None
    first.resign()
    second = Leadership(db, holder="second")
    new = second.campaign()
    assert new is not None and new.epoch == old.epoch + 1
    with db.write() as tx:
        new.check(tx)  # the leader's own: passes
    with pytest.raises(NotLeader, match=r"epoch 1\) no longer leads \(now epoch 2, second\)"):
        with db.write() as tx:
            old.check(tx)


def test_a_leader_that_lost_the_lead_rents_destroys_and_saves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "boxes.json"
    db = open_db(path)
    Registry(path).add(row("a-1", provider_id="1", status="running"))
    first = Leadership(db, holder="first")
    fence = first.campaign()
    assert fence is not None
    first.resign()
    assert Leadership(db, holder="second").campaign() is not None  # it took over
    before = dump(path)
    stale = Registry(path).fenced(fence)
    with pytest.raises(NotLeader):
        stale.add(row("a-2"))
    with pytest.raises(NotLeader):
        stale.mark_destroyed("a-1")
    with pytest.raises(NotLeader):
        stale.check_fence()
    with pytest.raises(NotLeader):
        Memory(tick=9).save(path, fence)
    assert dump(path) == before


def test_a_leader_whose_row_was_taken_over_says_it_lost(tmp_path: Path) -> None:
    db = open_db(tmp_path / "boxes.json")
    first = Leadership(db, holder="first")
    assert first.campaign() is not None and first.lost() is None
    sql(tmp_path / "boxes.json", "UPDATE leader SET epoch = epoch + 1, holder = 'usurper'")
    why = first.lost()
    assert why is not None and "usurper" in why
    assert first.fence is None  # it let go: it campaigns again from the start
    second = Leadership(db, holder="second")
    assert second.campaign() is not None  # its lock is free again


def test_an_unreachable_database_is_a_state_error_that_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite: a folder where its file belongs; PostgreSQL: no server at the URL's socket."""
    reg = tmp_path / "boxes.json"
    if is_postgres(reg):
        (tmp_path / "socket").mkdir()  # a folder no server listens in
        url = f"postgresql://fleet:secret@/fleet?host={tmp_path / 'socket'}"
        monkeypatch.setenv("FLEET_DATABASE_URL", url)
        with pytest.raises(StateError, match="cannot connect") as failed:
            Registry(reg).rows()
        assert url.replace(":secret@", ":***@") in str(failed.value)
        assert "secret" not in str(failed.value)
        assert os.listdir(tmp_path / "socket") == []
        return
    (tmp_path / "fleet.db").mkdir()  # a folder where the file belongs
    with pytest.raises(StateError, match="fleet.db"):
        Registry(reg).rows()
    assert os.listdir(tmp_path / "fleet.db") == []
