"""A last tick that cannot be saved costs the loop's page nothing: the page is written,
and the hook says what it did not write."""

from __future__ import annotations

from pathlib import Path

import page_fixture as F
import pytest
from state_fixture import add_rows, is_postgres, sql

from fleet.cli.loop_cmd import page_after_tick
from fleet.ops.loop import AfterTickNote, Tick
from fleet.state import last_tick


def refuse_writes(registry: Path) -> str:
    """The fleet's database reads but takes no write on this connection (the one the test's
    thread uses); what its refusal says. SQLite: its disk is full, it grows by no page.
    PostgreSQL: every transaction is read-only (no disk of the test's to fill)."""
    if is_postgres(registry):
        sql(registry, "SET default_transaction_read_only = on")
        return "read-only transaction"
    (pages,) = sql(registry, "PRAGMA page_count")
    sql(registry, f"PRAGMA max_page_count = {pages[0]}")
    return "full"


def test_a_last_tick_that_cannot_be_written_does_not_cost_the_page(tmp_path: Path) -> None:
    c = F.config(tmp_path)
    add_rows(c.registry, F.rows())
    last_tick.save(c.registry, 4, "2026-12-02T11:58:00Z", F.health(), now=F.NOW)
    why = refuse_writes(c.registry)
    out = tmp_path / "page"
    out.mkdir()
    write = page_after_tick(c, out)
    with pytest.raises(AfterTickNote, match=f"written, but not the last tick .*{why}"):
        write(Tick(5, "2026-12-02T11:59:00Z"), F.health() * 50)
    assert (out / "index.html").exists() and (out / "fleet.json").exists()
    tick = last_tick.load(c.registry)
    assert tick is not None and tick.number == 4  # the tick before, whole
