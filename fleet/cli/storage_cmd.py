"""`fleet storage review` and `fleet storage clean`: what fills the boxes and the operator's
state, and a cleanup of what a saved review listed as regenerable (fleet/ops/storage.py)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from fleet.cli import tables
from fleet.cli.common import app, cfg, emit, err, out, registry
from fleet.core.boxes import Row
from fleet.core.errors import FleetError, UsageError
from fleet.core.states import BoxKind
from fleet.core.times import utc_day
from fleet.ops.storage import printable

storage_app = typer.Typer(no_args_is_help=True, help="What fills the boxes, and a cleanup of "
                          "regenerable files by a saved review.")
app.add_typer(storage_app, name="storage")

REVIEW_COLUMNS = ("category", "kind", "size", "files", "oldest")
CLEAN_COLUMNS = ("category", "promised", "freed", "files")


def size(n: Any) -> str:
    """Bytes as a person reads them: `512 B`, `3.1 MiB`, `21.6 GiB`; `?` when unknown."""
    if not isinstance(n, int | float):
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _standing(labels: list[str]) -> list[Row]:
    """The live standing boxes the review reads: `labels`, or all of them."""
    rows = [r for r in registry().rows() if r.live and r.kind == BoxKind.STANDING and r.host_key]
    if not labels:
        return rows
    by = {r.label: r for r in rows}
    unknown = [lb for lb in labels if lb not in by]
    if unknown:
        raise UsageError(f"no live standing box {', '.join(unknown)} (fleet roster lists them)")
    return [by[lb] for lb in labels]


def _local(archive: bool) -> Any:
    """The local state's rules; the sandbox's folder counts as leftovers only while the
    sandbox provably runs no more (a status that cannot be read keeps it)."""
    from fleet.cli import sandbox_setup
    from fleet.core.paths import sandbox_dir
    from fleet.ops.storage import LocalRules
    from fleet.ops.teardown import archive_dir

    if not archive:
        return None
    c = cfg()
    box_dir = sandbox_dir().resolve()
    try:
        running = bool(sandbox_setup.status(box_dir).get("running", True))
    except Exception:  # noqa: BLE001 (whatever the reason, it is not provably stopped)
        running = True
    return LocalRules.of(c, archive_dir(c), box_dir if box_dir.is_dir() else None, running)


@storage_app.command("review")
def review_cmd(labels: list[str] = typer.Argument(None, metavar="[LABEL]..."),
               archive: bool = typer.Option(False, "--archive", help="also the local "
                                            "state: archive, release store, build cache"),
               as_json: bool = typer.Option(False, "--json", help="the review, to save for "
                                            "`fleet storage clean --from`")) -> None:
    """What fills each standing box (and with --archive the local state), by category,
    each regenerable or kept, and what a cleanup would free. Changes nothing, anywhere."""
    from fleet.ops import storage

    doc = storage.review(cfg(), _standing(labels or []), _local(archive))
    if as_json:
        emit(Table(), doc, True)
        return
    for label, part in doc["boxes"].items():
        tables.show(out, review_table(label, part))
    if "local" in doc:
        tables.show(out, review_table("local state", doc["local"]))
    for label, why in doc["errors"].items():
        err.print(f"{printable(label)}: not reviewed: {printable(why)}", markup=False,
                  highlight=False)
    out.print(f"a cleanup would free {size(doc['freeable_bytes'])} in all; save the review "
              "with --json and clean by it: fleet storage clean --from REVIEW.json",
              markup=False, highlight=False, soft_wrap=True)
    if doc["errors"]:
        raise FleetError(f"{len(doc['errors'])} boxes could not be reviewed")


def review_table(title: str, part: Mapping[str, Any]) -> Table:
    rows = [{"category": printable(c["name"]),
             "kind": "regenerable" if c["regenerable"] else "kept",
             "size": size(c["bytes"]), "files": tables.known(c["files"]),
             "oldest": _day(c["oldest"])}
            for c in part.get("categories") or []]
    d = part.get("disk") or {}
    caption = (f"would free {size(part.get('freeable_bytes'))}; disk free "
               f"{size(d.get('free_bytes'))} of {size(d.get('total_bytes'))}, after "
               f"{size(part.get('free_after_bytes'))}")
    return tables.build(printable(title), REVIEW_COLUMNS, rows, caption=caption)


def _day(mtime: Any) -> str:
    if not isinstance(mtime, int | float):
        return "-"
    return utc_day(datetime.fromtimestamp(mtime, UTC))


@storage_app.command("clean")
def clean_cmd(source: Path = typer.Option(None, "--from", metavar="REVIEW.json",
                                          help="a review saved by fleet storage review --json"),
              dry_run: bool = typer.Option(False, "--dry-run", help="delete nothing"),
              as_json: bool = typer.Option(False, "--json")) -> None:
    """Delete what the saved review listed as regenerable, and only where each file still
    has the size and mtime the review recorded; the rules refuse a kept file whatever the
    review says. Without a review it refuses."""
    from fleet.ops import storage

    if source is None:
        raise UsageError("fleet storage clean needs --from REVIEW.json (fleet storage review "
                         "--json): nothing is deleted without a review")
    reviewed = storage.load_review(source)
    rows = {r.label: r for r in registry().rows()}
    local = _local("local" in reviewed)
    done = storage.clean(cfg(), reviewed, rows, local, dry_run)
    if as_json:
        emit(Table(), done, True)
    else:
        for label, part in [*done["boxes"].items(), *(
                [("local state", done["local"])] if "local" in done else [])]:
            tables.show(out, clean_table(label, part))
            for what in ("skipped", "refused"):
                for x in part[what]:
                    out.print(f"{printable(label)}: {what} {printable(x['path'])}: "
                              f"{printable(x['why'])}", markup=False,
                              highlight=False, soft_wrap=True)
    for label, why in done["errors"].items():
        err.print(f"{printable(label)}: not cleaned: {printable(why)}", markup=False,
                  highlight=False)
    if done["errors"]:
        raise FleetError(f"{len(done['errors'])} reviewed boxes were not cleaned")


def clean_table(title: str, part: Mapping[str, Any]) -> Table:
    cats = part.get("categories") or {}
    rows = [{"category": printable(name), "promised": size(t["promised"]),
             "freed": size(t["freed"]),
             "files": tables.known(t["files"])} for name, t in cats.items() if t["promised"] or
            t["files"]]
    promised = sum(t["promised"] for t in cats.values())
    freed = sum(t["freed"] for t in cats.values())
    verb = "would free" if part.get("dry_run") else "freed"
    caption = (f"{verb} {size(freed)} of {size(promised)} promised; disk free "
               f"{size(part.get('free_before_bytes'))} before, "
               f"{size(part.get('free_after_bytes'))} after")
    return tables.build(printable(title), CLEAN_COLUMNS, rows, caption=caption)
