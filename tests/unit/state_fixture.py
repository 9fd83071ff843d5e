"""The fleet's state database for tests: what it holds, whole, to prove that nothing changed,
and direct SQL to damage a stored row the way a bad write or a hand edit would, bypassing the
code that guards it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fleet.core.boxes import Row
from fleet.state.db import open_db, url_for
from fleet.state.registry import Registry

# every table the schema makes, in the order `dump` lists them
TABLES = ("meta", "boxes", "docs", "check_history", "ticks", "tick_health", "leader",
          "check_claims")


def dump(registry: Path) -> str:
    """Every row of every table of the fleet's database, in one fixed order: equal before and
    after a command means the command wrote nothing (not even a document's time)."""
    with open_db(registry).read() as tx:
        return "\n".join(f"{table}: {row!r}" for table in TABLES
                         for row in sorted(tx.q(f"SELECT * FROM {table}"), key=repr))


def sql(registry: Path, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """One statement in its own write transaction on the fleet's database."""
    with open_db(registry).write() as tx:
        return tx.q(statement, params)


def add_rows(registry: Path, rows: Iterable[Row]) -> Registry:
    """The registry at `registry` holding `rows`, added through it, in order."""
    reg = Registry(registry)
    for r in rows:
        reg.add(r)
    return reg


def db_file(registry: Path) -> Path:
    """The SQLite file of the fleet's database (the default, `fleet.state.db.url_for`)."""
    url = url_for(registry)
    assert url.startswith("sqlite:///"), url
    return Path(url.removeprefix("sqlite://"))
