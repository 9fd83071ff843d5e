"""The registry's rows, read again only when something was written since: every write is seen,
whoever made it (this thread, another thread, another process, plain SQL)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from fleet.core.boxes import Row
from fleet.state.db import open_db
from fleet.state.registry import Registry


def _reg(tmp_path: Path) -> Registry:
    reg = Registry(tmp_path / "boxes.json")
    reg.add(Row("a-1", "vast", "live", "standing", "RTX 4090", 1, 0.3))
    assert [r.note for r in reg.rows()] == [None]
    return reg


def test_a_write_by_another_process_is_read(tmp_path: Path) -> None:
    reg = _reg(tmp_path)
    code = ("import sys; from pathlib import Path; from fleet.state.registry import Registry; "
            "Registry(Path(sys.argv[1])).update('a-1', note='from another process')")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "boxes.json")], check=True)
    assert [r.note for r in reg.rows()] == ["from another process"]


def test_a_write_by_another_thread_is_read(tmp_path: Path) -> None:
    reg = _reg(tmp_path)
    t = threading.Thread(target=lambda: Registry(reg.path).update("a-1", note="thread"))
    t.start()
    t.join()
    assert [r.note for r in reg.rows()] == ["thread"]


def test_plain_sql_on_the_same_connection_is_read(tmp_path: Path) -> None:
    reg = _reg(tmp_path)
    with open_db(reg.path).write() as tx:
        tx.q("DELETE FROM boxes")
    assert reg.rows() == []


def test_each_reader_gets_rows_of_its_own(tmp_path: Path) -> None:
    reg = _reg(tmp_path)
    first = reg.rows()
    first[0].note = "changed in memory only"
    assert [r.note for r in reg.rows()] == [None]


def _first_use(path: str, start: Any, ok: Any) -> None:
    start.wait()
    Registry(Path(path)).rows()
    ok.put(True)


def test_processes_opening_a_new_database_at_once_all_open_it(tmp_path: Path) -> None:
    """The first use of a new database turns it to WAL, which takes an exclusive lock SQLite
    does not wait for: openers take turns, none is refused with "database is locked"."""
    for attempt in range(5):
        path = tmp_path / str(attempt) / "boxes.json"
        ctx = multiprocessing.get_context("fork")
        n = 8
        start, ok = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_first_use, args=(str(path), start, ok)) for _ in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0] * n
