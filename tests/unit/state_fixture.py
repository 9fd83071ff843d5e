"""The fleet's state database for tests, in either dialect (the test's `FLEET_DATABASE_URL`, or
SQLite beside the registry): what it holds, whole, to prove that nothing changed, and direct
SQL to damage a stored row the way a bad write or a hand edit would, bypassing the code that
guards it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fleet.core.boxes import Row
from fleet.state.db import Database, Tx, open_db, open_url, url_for
from fleet.state.registry import Registry


def tables(tx: Tx) -> list[str]:
    """Every table of the fleet's database, by name: on PostgreSQL those of the schema its
    URL's search_path names (the test's own), on SQLite those of its file."""
    if tx.postgres:
        found = tx.q("SELECT table_name FROM information_schema.tables "
                     "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'")
    else:
        found = tx.q("SELECT name FROM sqlite_master WHERE type = 'table'")
    return sorted(name for (name,) in found)


def dump(registry: Path) -> str:
    """Every row of every table of the fleet's database, in one fixed order: equal before and
    after a command means the command wrote nothing (not even a document's time). Not the
    migrations' record: the first use of a database, this one's own included, writes it."""
    with open_db(registry).read() as tx:
        return "\n".join(f"{table}: {row!r}" for table in tables(tx)
                         if table != "schema_migrations"
                         for row in sorted(tx.q(f"SELECT * FROM {table}"), key=repr))


def sql(registry: Path, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """One statement in its own write transaction on the fleet's database."""
    with open_db(registry).write() as tx:
        return tx.q(statement, params)


def database(registry: Path) -> Database:
    """The fleet's database, past `open_db`'s refusal of an older fleet's files beside it."""
    return open_url(url_for(registry))


def is_postgres(registry: Path) -> bool:
    """Whether the fleet's database is PostgreSQL (the test runs on that backend)."""
    return database(registry).postgres


def add_rows(registry: Path, rows: Iterable[Row]) -> Registry:
    """The registry at `registry` holding `rows`, added through it, in order."""
    reg = Registry(registry)
    for r in rows:
        reg.add(r)
    return reg
