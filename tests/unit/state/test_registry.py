import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from state_fixture import dump, sql

from fleet.core.boxes import Row
from fleet.core.errors import BudgetExceeded, RegistryError, UsageError
from fleet.state.registry import Registry


def row(label: str, **kw: object) -> Row:
    base = dict(provider="vast", role="live", kind="standing", card="RTX 4090", gpu_count=1,
                usd_per_hour=0.4)
    base.update(kw)
    return Row(label=label, **base)  # type: ignore[arg-type]


def test_add_update_history(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "boxes.json")
    reg.add(row("live-vast-1"))
    reg.update("live-vast-1", status="running", provider_id="42")
    reg.mark_destroyed("live-vast-1")
    (r,) = reg.rows()
    assert r.status == "destroyed" and r.destroyed_at and r.provider_id == "42"
    assert not r.live
    assert sql(tmp_path / "boxes.json", "SELECT label, live FROM boxes") == \
        [("live-vast-1", 0)]  # destroyed rows stay
    assert not (tmp_path / "boxes.json").exists()  # the database holds them, no file


def test_duplicate_label_and_bad_label(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "boxes.json")
    reg.add(row("a-1"))
    with pytest.raises(UsageError, match="already in the registry"):
        reg.add(row("a-1"))
    with pytest.raises(UsageError, match="bad label"):
        reg.add(row("Bad Label!"))
    with pytest.raises(UsageError, match="no box labelled"):
        reg.update("nope", status="x")


def test_a_corrupt_row_names_its_label_and_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "boxes.json"
    Registry(p).add(row("a-1"))
    sql(p, "UPDATE boxes SET doc = substr(doc, 1, length(doc) - 20)")
    (broken,) = sql(p, "SELECT doc FROM boxes")
    with pytest.raises(RegistryError, match="registry row 'a-1' is corrupt"):
        Registry(p).rows()
    with pytest.raises(RegistryError, match="registry row 'a-1' is corrupt"):
        Registry(p).add(row("a-2"))
    assert sql(p, "SELECT doc FROM boxes") == [broken]  # never silently reset


@pytest.mark.parametrize(("doc", "message"), [
    ("[]", "registry row 'x': expected an object"),
    ('{"label": "x", "colour": "red"}', "registry row 'x': unknown field 'colour'"),
    ('{"label": "x"}', "registry row 'x': .*missing"),
])
def test_a_row_that_is_not_a_box_is_refused_by_its_label(tmp_path: Path, doc: str,
                                                         message: str) -> None:
    p = tmp_path / "boxes.json"
    Registry(p).add(row("x"))
    sql(p, "UPDATE boxes SET doc = ?", (doc,))
    with pytest.raises(RegistryError, match=message):
        Registry(p).rows()
    with pytest.raises(RegistryError, match=message):
        Registry(p).get("x")


def _writer(path: str, prefix: str, n: int) -> None:
    reg = Registry(Path(path))
    for i in range(n):
        reg.add(row(f"{prefix}-{i}"))


def _slow_writer(path: str, inside: str) -> None:
    """Changes a row and adds one in one write transaction, and is killed before its commit:
    it stalls once its first statement has run."""
    import fleet.state.registry as registry

    real = registry.put

    def stall(*args: Any) -> None:
        real(*args)
        Path(inside).touch()
        time.sleep(60)

    registry.put = stall  # type: ignore[assignment]
    with Registry(Path(path)).transaction() as rows:
        rows["a-0"].status = "changed by the victim"
        rows["victim-0"] = row("victim-0")


def test_concurrent_writers_with_one_killed_mid_write(tmp_path: Path) -> None:
    p = tmp_path / "boxes.json"
    Registry(p).add(row("a-0", status="running"))
    before = dump(p)
    inside = tmp_path / "victim-inside"
    ctx = multiprocessing.get_context("fork")
    victim = ctx.Process(target=_slow_writer, args=(str(p), str(inside)))
    victim.start()
    # wait until the victim holds the write lock and has written inside its transaction
    deadline = time.monotonic() + 30
    while not inside.exists():
        assert time.monotonic() < deadline, "victim never started writing"
        assert victim.exitcode is None, f"victim ended first: {victim.exitcode}"
        time.sleep(0.01)
    assert dump(p) == before  # a reader never sees a write before its commit
    writers = [ctx.Process(target=_writer, args=(str(p), f"w{k}", 25)) for k in range(4)]
    for w in writers:
        w.start()
    os.kill(victim.pid or 0, signal.SIGKILL)
    victim.join()
    for w in writers:
        w.join(60)
        assert w.exitcode == 0
    rows = {r.label: r for r in Registry(p).rows()}
    assert set(rows) == {"a-0"} | {f"w{k}-{i}" for k in range(4) for i in range(25)}
    assert rows["a-0"].status == "running"  # the victim's change is gone with it


def _reserver(path: str, label: str, limit: int, start: Any) -> None:
    """Add a row only while fewer than `limit` rows are live; exit 3 when refused."""

    def room(rows: list[Row]) -> None:
        time.sleep(0.2)  # a slow check: every process is inside it at once unless it is locked
        if sum(r.live for r in rows) >= limit:
            raise BudgetExceeded(f"{label}: {limit} live rows already")

    start.wait(30)
    try:
        Registry(Path(path)).add(row(label), check=room)
    except BudgetExceeded:
        sys.exit(3)


@pytest.mark.parametrize("limit", [1, 2])
def test_check_and_add_are_one_locked_step(tmp_path: Path, limit: int) -> None:
    p = tmp_path / "boxes.json"
    n = 5
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(n)
    procs = [ctx.Process(target=_reserver, args=(str(p), f"r-{i}", limit, start))
             for i in range(n)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode is not None, "a reserver hung"
    assert sorted(proc.exitcode for proc in procs) == [0] * limit + [3] * (n - limit)
    assert len(Registry(p).rows()) == limit


def test_a_refused_check_writes_nothing(tmp_path: Path) -> None:
    p = tmp_path / "boxes.json"
    reg = Registry(p)
    reg.add(row("a-1"))
    before = dump(p)

    def refuse(rows: list[Row]) -> None:
        assert [r.label for r in rows] == ["a-1"]
        raise BudgetExceeded("no")

    with pytest.raises(BudgetExceeded):
        reg.add(row("a-2"), check=refuse)
    assert dump(p) == before


def test_resume_replaces_only_an_unfinished_row(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "boxes.json")
    first = reg.add(row("a-1", created_at="2026-01-01T00:00:00Z", rerent_of="old-1"))
    seen: list[list[str]] = []
    again = reg.add(row("a-1", usd_per_hour=0.5), check=lambda rows: seen.append(
        [r.label for r in rows]), resume=True)
    assert seen == [["a-1"]]  # the check sees the row it replaces
    (kept,) = reg.rows()
    # the new create's time: the loop's deadline for it runs from there
    assert kept.usd_per_hour == 0.5 and kept.created_at == again.created_at > first.created_at
    assert kept.rerent_of == "old-1"  # what the first attempt was for stays
    for status, extra in [("running", {"host_key": "ssh-ed25519 AAAA"}),
                          ("failed", {"destroyed_at": "2026-01-01T01:00:00Z"}),
                          ("destroyed", {"destroyed_at": "2026-01-01T01:00:00Z"})]:
        reg.update("a-1", status=status, **extra)
        with pytest.raises(UsageError, match="already in the registry"):
            reg.add(row("a-1"), resume=True)


def test_a_re_read_is_the_database_as_it_is_now_whoever_changed_it(tmp_path: Path) -> None:
    """The parsed rows of an unchanged document are kept between reads (a tick reads the
    registry some twenty times): never past a change, even one that keeps the document's
    length, and never shared between readers, who may change their rows."""
    path = tmp_path / "boxes.json"
    reg = Registry(path)
    reg.add(row("a-1", status="running"))
    first = reg.rows()
    first[0].status = "changed by a reader"  # a caller's own copy
    assert reg.rows()[0].status == "running"
    reg.get("a-1").ssh_port = 1  # type: ignore[union-attr]
    assert reg.get("a-1").ssh_port is None  # type: ignore[union-attr]
    with reg.transaction() as rows:
        assert rows["a-1"].status == "running"
        rows["a-1"].status = "stopped"
    assert [r.status for r in Registry(path).rows()] == ["stopped"]  # another reader sees it
    # another writer changes the stored row directly: same length
    (doc,) = sql(path, "SELECT doc FROM boxes")
    sql(path, "UPDATE boxes SET doc = ?", (doc[0].replace('"stopped"', '"exited!"'),))
    assert [r.status for r in reg.rows()] == ["exited!"]
    # a value a hand edit put where a text belongs is the reader's own too
    d = json.loads(doc[0])
    d["note"] = ["a", "list"]
    sql(path, "UPDATE boxes SET doc = ?", (json.dumps(d),))
    mine = reg.rows()[0]
    mine.note.append("more")  # type: ignore[union-attr]
    assert reg.rows()[0].note == ["a", "list"]
    sql(path, "UPDATE boxes SET doc = '{'")  # broken since the last read: said, never the rows
    with pytest.raises(RegistryError, match="corrupt"):
        reg.rows()
    sql(path, "DELETE FROM boxes")
    assert reg.rows() == []
