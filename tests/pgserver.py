"""A real PostgreSQL server for the tests, one per pytest process (so one per xdist worker).

Fixtures (a pytest plugin, loaded by tests/conftest.py):

- `pg_server` (session): a server started on first use, stopped (`pg_ctl stop -m fast`) and its
  folders removed when the session ends, whether the tests passed or not.
- `pg_url` (each test): a fresh, empty database, dropped after the test; a libpq URL that
  psycopg connects to.
- `FLEET_TEST_BACKEND=postgresql` in the environment: every test gets `FLEET_DATABASE_URL` set
  to a fresh, empty schema of its own (the URL's `search_path`) in a database the worker's
  tests share, so the whole suite runs against PostgreSQL unchanged: a schema costs
  milliseconds where a database costs a checkpoint, and the fleet's advisory locks are keyed
  by the schema (`fleet.state.locks`). Unset (or empty), nothing happens and no server starts.

initdb refuses root, so the server runs as Debian's `postgres` user (made by the `postgresql`
package) from a temporary folder that user owns. It listens on a Unix socket only, in a folder
of that folder, 0700: only the server's user and root (the tests) reach it, so local `trust`
authentication is all there is. A socket works across the workers' network namespaces, and
each worker's server has its own socket folder, so they never meet. Durability stays as in
production: fsync, synchronous commit and full-page writes on.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

BACKEND_VARIABLE = "FLEET_TEST_BACKEND"
BACKENDS = ("postgresql",)  # unset or empty: the database layer's default
DATABASE_URL_VARIABLE = "FLEET_DATABASE_URL"

PG_LIB = Path("/usr/lib/postgresql")
SERVER_USER = "postgres"
SUPERUSER = "postgres"
PORT = 5432  # names the socket file only: no TCP, and each server has a socket folder of its own
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60
SETTINGS = {
    "listen_addresses": "''",
    "port": str(PORT),
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "unix_socket_permissions": "0700",
}


class PgServerError(RuntimeError):
    """The test server could not be set up, started or stopped."""


@dataclass(frozen=True)
class PgServer:
    top: Path  # owned by the server's user: data/, socket/, server.log
    socket_dir: Path
    port: int
    user: str  # the superuser to connect as

    @property
    def data_dir(self) -> Path:
        return self.top / "data"

    @property
    def log(self) -> Path:
        return self.top / "server.log"

    @classmethod
    def at(cls, top: Path) -> PgServer:
        return cls(top=top, socket_dir=top / "socket", port=PORT, user=SUPERUSER)

    def url(self, dbname: str) -> str:
        return (f"postgresql:///{quote(dbname)}?host={quote(str(self.socket_dir))}"
                f"&port={self.port}&user={quote(self.user)}")

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid, None when none runs on this data folder."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if os.fsencode(self.data_dir) in cmdline else None


def bin_dir() -> Path:
    """The newest PostgreSQL's programs, as Debian installs them (/usr/lib/postgresql/<ver>)."""
    found = sorted((int(d.name), d / "bin") for d in PG_LIB.glob("*")
                   if d.name.isdigit() and (d / "bin" / "initdb").is_file())
    if not found:
        raise PgServerError(f"PostgreSQL is not installed (no {PG_LIB}/<version>/bin/initdb): "
                            "`./run.sh setup` installs Debian's postgresql")
    return found[-1][1]


def _server_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise PgServerError(f"no user {SERVER_USER!r} (Debian's postgresql package makes it): "
                            "`./run.sh setup` installs it") from None


def _as_server_user(*argv: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    user = _server_user()
    return subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
        user=user.pw_uid, group=user.pw_gid, extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "LC_ALL": "C", "TZ": "UTC"})


def _log_tail(server: PgServer, lines: int = 20) -> str:
    try:
        return "\n".join(server.log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no server log: {e})"


def make_top() -> Path:
    """A new temporary folder, owned by the server's user and reachable by it alone."""
    user = _server_user()
    top = Path(tempfile.mkdtemp(prefix="fleet-pg-"))
    (top / "socket").mkdir(mode=0o700)
    for folder in (top, top / "socket"):
        os.chown(folder, user.pw_uid, user.pw_gid)
    return top


def start(server: PgServer, **changed: str) -> None:
    """initdb and start `server` in its folder (from make_top); returns once it takes
    connections. pg_ctl's wait is the bounded poll, and it watches the postmaster: a server that
    exits while starting fails this at once, with its log's tail. `changed`: settings other
    than SETTINGS (the benchmark's fsync=off)."""
    bins = bin_dir()
    r = _as_server_user(str(bins / "initdb"), "-D", str(server.data_dir), "-U", SUPERUSER,
                        "-E", "UTF8", "--locale=C", cwd=server.top, timeout=START_TIMEOUT_S)
    if r.returncode != 0:
        raise PgServerError(f"initdb failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    # the files keep their owner (the server's user): appended and rewritten, never replaced
    settings = {**SETTINGS, "unix_socket_directories": f"'{server.socket_dir}'", **changed}
    with (server.data_dir / "postgresql.conf").open("a") as f:
        f.write("\n# tests/pgserver.py\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))
    (server.data_dir / "pg_hba.conf").write_text("local all all trust\n")
    restart(server)


def restart(server: PgServer) -> None:
    """Start the server `start` made (and `stop` stopped) again, its data as it was."""
    bins = bin_dir()
    r = _as_server_user(str(bins / "pg_ctl"), "start", "-D", str(server.data_dir),
                        "-l", str(server.log), "-w", "-t", str(START_TIMEOUT_S),
                        cwd=server.top, timeout=START_TIMEOUT_S + 30)
    if r.returncode != 0:
        raise PgServerError(f"pg_ctl start failed ({r.returncode}): {r.stdout.strip()} "
                            f"{r.stderr.strip()}\nserver log:\n{_log_tail(server)}")
    with psycopg.connect(server.url("postgres"), connect_timeout=10) as conn:
        conn.execute("SELECT 1")


def stop(server: PgServer) -> None:
    """Stop the server (fast: open sessions are ended) and wait until its processes are gone.
    When pg_ctl cannot, the postmaster is killed; either way its failure is raised."""
    if server.postmaster_pid() is None:
        return
    r = _as_server_user(str(bin_dir() / "pg_ctl"), "stop", "-D", str(server.data_dir),
                        "-m", "fast", "-w", "-t", str(STOP_TIMEOUT_S),
                        cwd=server.top, timeout=STOP_TIMEOUT_S + 30)
    if r.returncode == 0 and server.postmaster_pid() is None:
        return
    pid = server.postmaster_pid()
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while server.postmaster_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    raise PgServerError(f"pg_ctl stop failed ({r.returncode}): {r.stdout.strip()} "
                        f"{r.stderr.strip()}; the postmaster was killed\n{_log_tail(server)}")


def admin(server: PgServer) -> psycopg.Connection:
    return psycopg.connect(server.url("postgres"), autocommit=True, connect_timeout=10)


def create_database(server: PgServer) -> str:
    """A new, empty database; its name."""
    name = f"test_{uuid.uuid4().hex}"
    with admin(server) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


def drop_database(server: PgServer, name: str) -> None:
    with admin(server) as conn:  # FORCE: a connection the test left open is ended
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def running(**changed: str) -> Iterator[PgServer]:
    """A server started in a new folder; stopped and the folder removed on the way out, also
    when it failed to start (pg_ctl may have given up on a postmaster that still runs)."""
    server = PgServer.at(make_top())
    try:
        start(server, **changed)
        yield server
    finally:
        try:
            stop(server)
        finally:
            shutil.rmtree(server.top)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    with running() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    name = create_database(pg_server)
    try:
        yield pg_server.url(name)
    finally:
        drop_database(pg_server, name)


def chosen_backend() -> str:
    return os.environ.get(BACKEND_VARIABLE, "")


def pytest_configure(config: pytest.Config) -> None:
    backend = chosen_backend()
    if backend and backend not in BACKENDS:
        raise pytest.exit(f"{BACKEND_VARIABLE}={backend!r}: expected "
                          f"{' or '.join(BACKENDS)}, or unset", returncode=2)


@pytest.fixture(scope="session")
def pg_shared_database(pg_server: PgServer) -> str:
    """One database for the worker's tests, each in a schema of its own (`pg_schema_url`)."""
    return create_database(pg_server)


@pytest.fixture
def pg_schema_url(pg_server: PgServer, pg_shared_database: str) -> Iterator[str]:
    """A fresh, empty schema: a URL whose sessions work in it alone (their search_path)."""
    name = f"t_{uuid.uuid4().hex}"
    with psycopg.connect(pg_server.url(pg_shared_database), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield pg_server.url(pg_shared_database) + f"&options={quote(f'-csearch_path={name}')}"
    finally:
        with psycopg.connect(pg_server.url(pg_shared_database), autocommit=True) as conn:
            # the sessions the test left open end with it: one inside a transaction would
            # hold the drop below
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                         "pid <> pg_backend_pid() AND datname = current_database() AND "
                         "backend_type = 'client backend'")
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture(autouse=True)
def _database_backend(request: pytest.FixtureRequest) -> None:
    if chosen_backend() == "postgresql":
        monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setenv(DATABASE_URL_VARIABLE, request.getfixturevalue("pg_schema_url"))
