"""The fleet's state database: SQLite beside the registry by default, PostgreSQL by one setting.

Which database: `FLEET_DATABASE_URL` in the environment, else fleet.toml's `fleet.database`,
else `sqlite:///<state>/fleet.db`, the folder of the (old) registry path (`url_for`). Both
speak the same SQL through `Tx`: `?` placeholders, `ON CONFLICT ... DO UPDATE`, partial unique
indexes; `Tx.q` translates the placeholders for psycopg.

Writes are serialized, as the registry's file lock did: SQLite by `BEGIN IMMEDIATE` (one
writer at a time, WAL and full sync), PostgreSQL by a transaction-scoped advisory lock taken
first in every write transaction. So a check made in a write transaction (the budget, a slot,
the leader's epoch) holds until its commit; the schema's unique indexes are the last word
where code could not see another writer's row (`fleet.state.schema`).

One connection per thread and process (`open_db`): the loop's checks run in threads.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from fleet.core.fileutil import locked
from fleet.core.paths import database_url
from fleet.core.times import now_iso
from fleet.core.errors import RegistryError, StateError, UsageError
from fleet.state import locks, schema

ENV = "FLEET_DATABASE_URL"
BUSY_TIMEOUT_MS = 60_000  # a writer waits this long for another's transaction to end
CONNECT_S = 10  # a PostgreSQL server that takes longer to accept a connection did not answer


def url_for(registry: Path) -> str:
    """The database of the fleet whose (old) registry path is `registry`."""
    return (os.environ.get(ENV) or database_url(registry)
            or f"sqlite:///{registry.parent.absolute() / 'fleet.db'}")


def describe(url: str) -> str:
    """The URL without its password, to say in a line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


class LegacyState(UsageError):
    """The fleet's state is still in the JSON files of an older fleet."""


class Duplicate(RegistryError):
    """A write the schema's uniqueness refused (a slot, a replacement, a provider id)."""


class Tx:
    """One transaction's statements, in either dialect."""

    def __init__(self, raw: Any, postgres: bool) -> None:
        self._raw = raw
        self.postgres = postgres

    def q(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.postgres:
            sql = sql.replace("?", "%s")
        with _said():
            cur = self._raw.execute(sql, tuple(params))
            return list(cur.fetchall()) if cur.description is not None else []

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = self.q(sql, params)
        return rows[0] if rows else None

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        with _said():
            if self.postgres:
                with self._raw.cursor() as cur:
                    cur.executemany(sql.replace("?", "%s"), [tuple(r) for r in rows])
            else:
                self._raw.executemany(sql, [tuple(r) for r in rows])


@contextlib.contextmanager
def _said() -> Iterator[None]:
    """A statement's failure as the fleet's errors: Duplicate where the schema refused a row,
    StateError for the database's others (its disk full, locked past the wait, its connection
    lost), which callers that must go on without a write (the loop's page) can catch."""
    try:
        yield
    except sqlite3.IntegrityError as e:
        raise Duplicate(f"the database refused it: {_sqlite_refusal(str(e))}") from None
    except sqlite3.Error as e:
        raise StateError(f"the state database failed: {e}") from None
    except Exception as e:
        if type(e).__name__ in ("UniqueViolation", "IntegrityError"):
            raise Duplicate(f"the database refused it: {_postgres_refusal(e)}") from None
        if type(e).__module__.split(".")[0] == "psycopg":
            raise StateError(f"the state database failed: {str(e).strip().splitlines()[0]}"
                             if str(e).strip() else f"the state database failed: {e!r}"
                             ) from None
        raise


def _second_row(table: str, columns: Sequence[str]) -> str:
    """A uniqueness refusal in the same words on both backends."""
    return "a second row with the same " + ", ".join(f"{table}.{c}" for c in columns)


def _sqlite_refusal(message: str) -> str:
    """SQLite's `UNIQUE constraint failed: boxes.provider, boxes.provider_id`."""
    found = re.fullmatch(r"UNIQUE constraint failed: (\w+)\.\w+(?:, \1\.\w+)*", message)
    if found is None:
        return message  # another constraint (NOT NULL, ...): as SQLite says it
    return _second_row(found[1], [c.split(".", 1)[1] for c in message.split(": ", 1)[1]
                                  .split(", ")])


def _postgres_refusal(e: Exception) -> str:
    """PostgreSQL's unique violation, its table and the key's columns from its diagnostics
    (`Key (provider, provider_id)=(vast, 31) already exists.`); where they do not say (another
    constraint, a server speaking another language), its own first line."""
    diag = getattr(e, "diag", None)
    table = getattr(diag, "table_name", None)
    key = re.match(r"Key \(([\w, ]+)\)=", getattr(diag, "message_detail", None) or "")
    if type(e).__name__ == "UniqueViolation" and table and key:
        return _second_row(table, key[1].split(", "))
    return str(e).strip().splitlines()[0]


class Database:
    """A fleet's database: `write()` and `read()` transactions on this thread's connection."""

    postgres = False

    def __init__(self, url: str) -> None:
        self.url = url
        self.shown = describe(url)  # the URL to say: no password
        self._local = threading.local()
        self._migrated = False
        self.checked_legacy: set[Path] = set()  # registry paths `open_db` checked
        self._mlock = threading.Lock()

    # what each backend gives
    def _connect(self) -> Any:
        raise NotImplementedError

    def _begin_write(self, raw: Any) -> None:
        raise NotImplementedError

    def _begin_read(self, raw: Any) -> None:
        raise NotImplementedError

    def _begin_rows(self, raw: Any) -> None:
        raise NotImplementedError

    def _conn(self) -> Any:
        raw = getattr(self._local, "raw", None)
        if raw is None:
            raw = self._local.raw = self._connect()
        return raw

    def thread_local(self) -> threading.local:
        """What this thread keeps of this database (its connection, what it read)."""
        return self._local

    def drop_connection(self) -> None:
        """Forget this thread's connection (closed, or lost: the next use makes a new one)."""
        raw = getattr(self._local, "raw", None)
        self._local.raw = None
        self._local.registry_rows = None  # read on the connection gone
        if raw is not None:
            with contextlib.suppress(Exception):
                raw.close()

    @contextlib.contextmanager
    def _tx(self, write: bool | None, migrate: bool) -> Iterator[Tx]:
        if migrate:
            self.migrate()
        if getattr(self._local, "open", False):
            raise StateError("a state transaction inside another one on the same thread")
        raw = self._conn()
        self._local.open = True
        try:
            try:
                begin = {True: self._begin_write, False: self._begin_read,
                         None: self._begin_rows}[write]
                begin(raw)
            except Exception as e:
                self.drop_connection()
                raise StateError(f"state database {describe(self.url)}: {e}") from None
            try:
                yield Tx(raw, self.postgres)
            except BaseException:
                with contextlib.suppress(Exception):
                    raw.rollback() if self.postgres else raw.execute("ROLLBACK")
                raise
            try:
                raw.commit() if self.postgres else raw.execute("COMMIT")
            except Exception as e:
                self.drop_connection()
                raise StateError(f"state database {describe(self.url)}: commit failed: {e}"
                                 ) from None
            if write:
                self._local.writes = getattr(self._local, "writes", 0) + 1
        finally:
            self._local.open = False

    def seen(self, tx: Tx) -> tuple[int, int] | None:
        """What changes if anything was written since this thread's connection last asked:
        for a cache of what it read (None: no such token, read afresh)."""
        return None

    def write(self) -> contextlib.AbstractContextManager[Tx]:
        """A transaction that may write: one writer at a time, all of it or nothing."""
        return self._tx(True, True)

    def read(self) -> contextlib.AbstractContextManager[Tx]:
        """A transaction that reads one consistent snapshot."""
        return self._tx(False, True)

    def rows(self) -> contextlib.AbstractContextManager[Tx]:
        """A write transaction that locks only the rows it selects `FOR UPDATE`: on PostgreSQL
        it does not wait for other writers (`fleet.state.claims`); on SQLite it is `write`."""
        return self._tx(None, True)

    def migrate(self) -> None:
        if self._migrated:
            return
        with self._mlock:
            if not self._migrated:
                migrate(self)
                self._migrated = True

    def migration_tx(self) -> contextlib.AbstractContextManager[Tx]:
        """A write transaction that also holds the migration lock (`fleet.state.schema`)."""
        return self._tx(True, False)


class SQLite(Database):
    def __init__(self, url: str, path: Path) -> None:
        super().__init__(url)
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # one opener at a time: turning a new file to WAL takes an exclusive lock that
            # SQLite does not wait for (no busy handler there), so processes opening a new
            # database at once would see "database is locked"
            with locked(self.path.with_name(self.path.name + ".open")):
                raw = sqlite3.connect(self.path, isolation_level=None,
                                      timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=True)
                raw.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                found = raw.execute("PRAGMA journal_mode").fetchone()
                if not found or str(found[0]).lower() != "wal":
                    raw.execute("PRAGMA journal_mode = WAL")
                raw.execute("PRAGMA synchronous = FULL")
        except (OSError, sqlite3.Error) as e:
            raise StateError(f"state database {self.path}: cannot open: {e}") from None
        return raw

    def _begin_write(self, raw: sqlite3.Connection) -> None:
        raw.execute("BEGIN IMMEDIATE")

    def seen(self, tx: Tx) -> tuple[int, int] | None:
        """SQLite's data_version (another connection's commits) and this connection's own
        write transactions, which data_version does not count."""
        found = tx.one("PRAGMA data_version")
        return None if found is None else (int(found[0]), getattr(self._local, "writes", 0))

    def _begin_read(self, raw: sqlite3.Connection) -> None:
        raw.execute("BEGIN")

    def _begin_rows(self, raw: sqlite3.Connection) -> None:
        raw.execute("BEGIN IMMEDIATE")


class Postgres(Database):
    postgres = True

    def _connect(self) -> Any:
        try:
            import psycopg
        except ImportError:
            raise StateError(f"{ENV} names PostgreSQL ({describe(self.url)}) but psycopg is "
                             "not installed: pip install 'psycopg[binary]'") from None
        try:
            return psycopg.connect(self.url, autocommit=False, connect_timeout=CONNECT_S)
        except psycopg.Error as e:
            raise StateError(f"state database {describe(self.url)}: cannot connect: "
                             f"{str(e).strip().splitlines()[0] if str(e).strip() else e}"
                             ) from None

    def _begin_write(self, raw: Any) -> None:
        raw.execute(f"SELECT pg_advisory_xact_lock(%s, {locks.SCHEMA_KEY})", (locks.WRITE,))

    def _begin_read(self, raw: Any) -> None:
        raw.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def _begin_rows(self, raw: Any) -> None:
        raw.execute("SELECT 1")  # READ COMMITTED: row locks only


_OPEN: dict[tuple[str, int], Database] = {}
_OPEN_LOCK = threading.Lock()
_OPEN_MAX = 16  # databases kept open per process (a process that visits many closes the oldest)


def open_url(url: str) -> Database:
    """The database at `url` (one object per URL and process, the most recent few kept)."""
    key = (url, os.getpid())
    with _OPEN_LOCK:
        db = _OPEN.pop(key, None)
        if db is None:
            db = _make(url)
            if len(_OPEN) >= _OPEN_MAX:
                oldest = next(iter(_OPEN))
                _OPEN.pop(oldest).drop_connection()
        _OPEN[key] = db  # the most recent last
        return db


def open_db(registry: Path) -> Database:
    """The database of the fleet whose registry path is `registry` (`url_for`). Refused while
    the database holds no box and the JSON registry of an older fleet is there: it would read
    as an empty fleet (`fleet state import` moves it in)."""
    db = open_url(url_for(registry))
    if registry not in db.checked_legacy:
        if registry.is_file() and registry.suffix == ".json":
            with db.read() as tx:
                empty = (tx.one("SELECT 1 FROM boxes LIMIT 1") is None
                         and tx.one("SELECT 1 FROM meta WHERE key = 'imported_at'") is None)
            if empty:
                raise LegacyState(
                    f"{registry} holds this fleet's boxes as an older fleet kept them, and the "
                    f"state database {describe(db.url)} has none: run `fleet state import` "
                    "first (the JSON files are kept as they are)")
        db.checked_legacy.add(registry)
    return db


def _version(tx: Tx) -> int:
    if tx.postgres:
        present = tx.one("SELECT to_regclass('schema_migrations') IS NOT NULL")
        exists = bool(present and present[0])
    else:
        exists = tx.one("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                        "AND name = 'schema_migrations'") is not None
    if not exists:
        tx.q("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
             "name TEXT NOT NULL, applied_at TEXT NOT NULL)")
        return 0
    row = tx.one("SELECT MAX(version) FROM schema_migrations")
    return int(row[0]) if row and row[0] is not None else 0


def version(db: Database) -> int:
    """The highest migration the database has."""
    with db.migration_tx() as tx:
        return _version(tx)


def migrate(db: Database) -> int:
    """Apply every migration the database lacks, each in its own transaction under the
    migration lock (`fleet.state.schema`); the version."""
    at = 0
    for number, name, statements in schema.MIGRATIONS:
        with db.migration_tx() as tx:
            if tx.postgres:
                tx.q(f"SELECT pg_advisory_xact_lock(?, {locks.SCHEMA_KEY})", (locks.MIGRATE,))
            at = _version(tx)
            if at > schema.LATEST:
                raise StateError(
                    f"state database {db.shown}: schema version {at} is newer than this "
                    f"fleet's {schema.LATEST}; upgrade fleet (nothing was changed)")
            if at >= number:
                continue
            for sql in statements:
                tx.q(sql)
            tx.q("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                 (number, name, now_iso()))
            at = number
    return at


def _make(url: str) -> Database:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        path = "/" + path.lstrip("/") if path.startswith("/") else path  # sqlite:////abs
        if not path or path == "/":
            raise StateError(f"database URL {url!r}: no file (sqlite:///path/to/fleet.db)")
        return SQLite(url, Path(path))
    if parts.scheme in ("postgresql", "postgres"):
        return Postgres(url)
    raise StateError(f"database URL {describe(url)!r}: use sqlite:///path or postgresql://...")
