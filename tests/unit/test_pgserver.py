"""The tests' PostgreSQL server (tests/pgserver.py): a real server as an unprivileged user, on a
private socket, a fresh database per test, nothing left once the session ends, and the switch
that runs the suite against it. A session's own ends are seen from outside it: those tests run
pytest on a small test file in a process of its own."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pgserver import SERVER_USER, PgServer, PgServerError, running

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def user_tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname NOT IN "
            "('pg_catalog', 'information_schema')")]


def uids(pid: int) -> set[int]:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                if x.startswith("Uid:"))
    return {int(u) for u in line.split()[1:]}


def processes_under(folder: Path) -> list[int]:
    """The live pids whose command line names a path in `folder` (a postmaster names its data
    folder)."""
    prefix = os.fsencode(folder)
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                words = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # gone meanwhile
            if any(w == prefix or w.startswith(prefix + b"/") for w in words):
                found.append(int(proc.name))
    return found


def test_a_test_gets_an_empty_database_it_can_write(pg_url: str) -> None:
    assert user_tables(pg_url) == []
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE boxes (label text PRIMARY KEY)")
        conn.execute("INSERT INTO boxes VALUES ('live-3f9c2a-vast-0b12ef')")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT label FROM boxes").fetchall() == [("live-3f9c2a-vast-0b12ef",)]


def test_the_server_runs_as_an_unprivileged_user(pg_server: PgServer, pg_url: str) -> None:
    postmaster = pg_server.postmaster_pid()
    assert postmaster is not None
    server_uid = pwd.getpwnam(SERVER_USER).pw_uid
    assert server_uid != 0 and uids(postmaster) == {server_uid}
    with psycopg.connect(pg_url) as conn:  # the backend serving root's connection, too
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert backend is not None and uids(backend[0]) == {server_uid}


def test_the_server_listens_on_a_private_socket_only_and_syncs(pg_server: PgServer,
                                                               pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        def show(name: str) -> str:
            row = conn.execute(f"SHOW {name}").fetchone()
            assert row is not None
            return str(row[0])
        assert show("listen_addresses") == ""
        assert show("unix_socket_directories") == str(pg_server.socket_dir)
        assert [show(s) for s in ("fsync", "synchronous_commit", "full_page_writes")] == \
            ["on"] * 3
    folder = pg_server.socket_dir.stat()
    assert stat.S_IMODE(folder.st_mode) == 0o700
    assert folder.st_uid == pwd.getpwnam(SERVER_USER).pw_uid


@pytest.fixture
def scratch() -> Iterator[Path]:
    """The TMPDIR of a pytest run below: where its server's folders go, reachable by the
    server's user (pytest's own temporary folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="fleet-pgserver-test-"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        for pid in processes_under(folder):  # a server the run left behind (a failed test)
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder)


def run_pytest(tmp_path: Path, scratch: Path, body: str,
               **env: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    """pytest, in a process of its own, on a test file of `body` with tests/pgserver.py as its
    plugin; its tests append JSON lines to REPORT (what they saw), returned with the run."""
    (tmp_path / "test_small.py").write_text(textwrap.dedent("""\
        import json, os, pathlib, psycopg
        def report(**seen):
            with open(os.environ["REPORT"], "a") as f:
                f.write(json.dumps(seen) + "\\n")
        """) + textwrap.dedent(body))
    report = tmp_path / "report.jsonl"
    environ = {k: v for k, v in os.environ.items()
               if k not in ("FLEET_TEST_BACKEND", "FLEET_DATABASE_URL", "PYTEST_ADDOPTS")}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "pgserver", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_small.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**environ, "PYTHONPATH": f"{TESTS}:{REPO}", "TMPDIR": str(scratch),
             "REPORT": str(report), **env})
    lines = report.read_text().splitlines() if report.exists() else []
    return r, [json.loads(line) for line in lines]


def test_each_test_gets_a_fresh_database_and_sees_no_other(tmp_path: Path,
                                                          scratch: Path) -> None:
    r, seen = run_pytest(tmp_path, scratch, """\
        def test_first(pg_url):
            with psycopg.connect(pg_url) as conn:
                conn.execute("CREATE TABLE marks (m text)")
                conn.execute("INSERT INTO marks VALUES ('first')")
                name = conn.execute("SELECT current_database()").fetchone()[0]
            report(name=name)

        def test_second(pg_url):
            with psycopg.connect(pg_url) as conn:
                name = conn.execute("SELECT current_database()").fetchone()[0]
                tables = conn.execute("SELECT tablename FROM pg_tables "
                                      "WHERE schemaname = 'public'").fetchall()
                databases = [r[0] for r in conn.execute("SELECT datname FROM pg_database")]
            report(name=name, tables=tables, databases=databases)
        """)
    assert r.returncode == 0, r.stdout + r.stderr
    first, second = seen
    assert first["name"] != second["name"]
    assert second["tables"] == []
    # the first test's database was dropped when it ended
    assert second["name"] in second["databases"]  # type: ignore[operator]
    assert first["name"] not in second["databases"]  # type: ignore[operator]


def test_the_server_and_its_folders_are_gone_after_the_session_though_a_test_failed(
        tmp_path: Path, scratch: Path) -> None:
    r, seen = run_pytest(tmp_path, scratch, """\
        def test_uses_the_server(pg_server, pg_url):
            report(top=str(pg_server.top), data=str(pg_server.data_dir),
                   pid=pg_server.postmaster_pid())

        def test_fails(pg_url):
            assert False, "a failing test"
        """)
    assert r.returncode == 1 and "1 failed, 1 passed" in r.stdout, r.stdout + r.stderr
    [during] = seen
    assert isinstance(during["pid"], int)  # a server ran during the session
    assert processes_under(Path(str(during["data"]))) == []
    assert not Path(str(during["top"])).exists()
    assert list(scratch.iterdir()) == []


def test_the_backend_switch_gives_each_test_a_fresh_database_url(tmp_path: Path,
                                                                 scratch: Path) -> None:
    r, seen = run_pytest(tmp_path, scratch, """\
        def test_first():
            url = os.environ["FLEET_DATABASE_URL"]
            with psycopg.connect(url) as conn:
                conn.execute("CREATE TABLE marks (m text)")
            report(url=url, servers=[p.name for p in pathlib.Path(os.environ["TMPDIR"]).iterdir()])

        def test_second():
            url = os.environ["FLEET_DATABASE_URL"]
            with psycopg.connect(url) as conn:
                tables = conn.execute("SELECT tablename FROM pg_tables "
                                      "WHERE schemaname = 'public'").fetchall()
            report(url=url, tables=tables)
        """, FLEET_TEST_BACKEND="postgresql")
    assert r.returncode == 0, r.stdout + r.stderr
    first, second = seen
    assert first["url"] != second["url"] and second["tables"] == []
    assert [name.startswith("fleet-pg-") for name in first["servers"]] == [True]  # type: ignore[union-attr]
    assert list(scratch.iterdir()) == []


def test_without_the_backend_switch_no_server_starts(tmp_path: Path, scratch: Path) -> None:
    r, seen = run_pytest(tmp_path, scratch, """\
        def test_plain():
            report(url=os.environ.get("FLEET_DATABASE_URL"),
                   servers=[p.name for p in pathlib.Path(os.environ["TMPDIR"]).iterdir()])
        """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert seen == [{"url": None, "servers": []}]


def test_an_unknown_backend_is_refused_in_one_line_with_status_2(tmp_path: Path,
                                                                 scratch: Path) -> None:
    r, seen = run_pytest(tmp_path, scratch, """\
        def test_plain():
            report(ran=True)
        """, FLEET_TEST_BACKEND="postgres")
    assert r.returncode == 2 and seen == []
    assert r.stderr.strip().splitlines() == [
        "Exit: FLEET_TEST_BACKEND='postgres': expected postgresql, or unset"], r.stderr


def test_a_server_that_cannot_start_fails_with_its_own_words_and_leaves_nothing(
        scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where its folder goes
    with pytest.raises(PgServerError) as failed, running(shared_buffers="'lots'"):
        pass
    assert 'invalid value for parameter "shared_buffers": "lots"' in str(failed.value)
    assert list(scratch.iterdir()) == []
