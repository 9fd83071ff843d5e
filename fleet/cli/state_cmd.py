"""`fleet state`: where the fleet's state lives, and moving an older fleet's JSON files in."""

from __future__ import annotations

from pathlib import Path

import typer

from fleet.cli.common import cfg, out, state_app


@state_app.command("import")
def import_cmd(
    folder: Path = typer.Option(None, "--from", help="the folder of the JSON files (default: "
                                "the registry's, fleet.toml's fleet.registry)"),
) -> None:
    """Move boxes.json, loop.json, bills.json, last_tick.json and check-history.json into the
    state database, in one transaction, each row read back and compared. The files are kept
    as they are. Importing the same files again changes nothing."""
    from fleet.state.db import describe, open_url, url_for
    from fleet.state.importer import import_files

    c = cfg()
    src = folder if folder is not None else c.registry.parent
    db = open_url(url_for(c.registry))
    got = import_files(src, db, c.registry)
    parts = [f"{got.rows} rows" + (f" ({got.already} already there)" if got.already else "")]
    if got.memory:
        parts.append("the loop's memory")
    if got.bills:
        parts.append("the last bills")
    if got.tick_boxes is not None:
        parts.append(f"the last tick ({got.tick_boxes} boxes)")
    if got.history:
        parts.append(f"the check history ({got.history} boxes)")
    out.print(f"imported {', '.join(parts)} from {src} into {describe(db.url)}; each row read "
              "back and matched; the JSON files are kept as they were", highlight=False,
              soft_wrap=True)


@state_app.command("show")
def show_cmd() -> None:
    """Where the state lives, its schema version, its rows and whose loop leads."""
    from fleet.state import schema
    from fleet.state.db import describe, open_db, version
    from fleet.state.leader import current

    c = cfg()
    db = open_db(c.registry)
    with db.read() as tx:
        boxes = tx.one("SELECT COUNT(*), COALESCE(SUM(live), 0) FROM boxes")
        lead = current(tx)
    at = version(db)
    assert boxes is not None
    out.print(f"database: {describe(db.url)}", highlight=False, soft_wrap=True)
    out.print(f"schema: {at} of {schema.LATEST}", highlight=False)
    out.print(f"boxes: {boxes[0]} rows, {boxes[1]} live", highlight=False)
    out.print("leader: none yet" if lead is None else
              f"leader: {lead.holder}, epoch {lead.epoch}, since {lead.since}, last seen "
              f"{lead.seen_at}", highlight=False, soft_wrap=True)
