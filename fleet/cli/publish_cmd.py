"""`fleet release add|list` and `fleet publish`: node releases and their rollout."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from fleet.core.errors import UsageError
from fleet.state.registry import check_label

if TYPE_CHECKING:
    from fleet.ops.publish import BoxRow
    from fleet.state.releases import Release

from fleet.cli import common, tables
from fleet.cli.common import app, cfg, emit, err, out, release_app


@release_app.command("add")
def release_add(src: Path = typer.Argument(..., help="folder with igneumd, igneum-miner, "
                                           "igneum-prover"),
                version: str = typer.Option(..., "--version", help="e.g. 1.6.0"),
                as_json: bool = typer.Option(False, "--json")) -> None:
    """Record the release in SRC as VERSION: files copied, sizes and sha256 in the manifest."""
    from fleet.state import releases

    if not src.is_dir():
        raise UsageError(f"{src}: not a folder")
    rel, added = releases.add(cfg().releases, src, version)
    if as_json:
        sys.stdout.write(json.dumps({**rel.to_json(), "added": added}, indent=1) + "\n")
        return
    out.print(f"{'added' if added else 'already recorded:'} release {rel.version} "
              f"(node {rel.node_sha16}) in {cfg().releases}", highlight=False)


@release_app.command("list")
def release_list(as_json: bool = typer.Option(False, "--json")) -> None:
    """The releases in the store, oldest first, with their files' digests and sizes."""
    from fleet.ops import publish as publish_mod
    from fleet.state import releases

    store = cfg().releases
    rels = releases.sorted_releases(releases.load_or_empty(store))
    rows, data = [], []
    for r in rels:
        problems = releases.verify(r)
        try:
            rec = json.loads((r.path / publish_mod.RECORD).read_text())
        except (OSError, ValueError):
            rec = {}
        rows.append(release_row(r, problems, rec))
        data.append({**r.to_json(), "path": str(r.path), "problems": problems,
                     "last_publish": {k: rec.get(k) for k in ("outcome", "updated_at")}
                     if rec else None})
    emit(releases_table(store, rows), data, as_json)


RELEASE_COLUMNS = ("version", "node sha16", "igneumd", "igneum-miner", "igneum-prover", "files",
                   "last publish")


def releases_table(store: Path, rows: Sequence[Mapping[str, str]]) -> Table:
    """`fleet release list`'s table from its rows' cells (`release_row`)."""
    caption = None if rows else "no releases yet: fleet release add DIR --version V"
    return tables.build(f"releases in {store}", RELEASE_COLUMNS, rows, caption=caption)


def release_row(r: Release, problems: list[str], rec: Mapping[str, Any]) -> dict[str, str]:
    """A release's cells: its files' digests and sizes, what `releases.verify` found wrong
    with them, and the outcome of its last publish (`rec`, its publish record, {} if none)."""
    from fleet.state import releases

    last = rec.get("outcome") or "-"
    if rec.get("updated_at"):
        last += f" {rec['updated_at']}"
    return {"version": r.version, "node sha16": r.node_sha16,
            **{n: f"{r.sha256[n][:16]} {r.sizes.get(n, '?')} B" for n in releases.FILES},
            "files": "ok" if not problems else "; ".join(problems), "last publish": last}


@app.command("publish")
def publish_cmd(
    version: str = typer.Argument(..., help="release version (or node sha16) from the store"),
    role: str = typer.Option(None, help="only the standing boxes of this role"),
    canary: str = typer.Option(None, help="the box that switches first, alone"),
    waves: str = typer.Option("1,rest", help="wave sizes: counts, shares, rest (1,2,25%,rest)"),
    soak: float = typer.Option(0.0, "--soak", help="seconds to wait between waves"),
    allow_downgrade: list[str] = typer.Option(
        [], "--allow-downgrade", help="a box that may be switched although it runs newer"),
    stable_s: int = typer.Option(60, "--stable-s", help="the new node must stay synced this long"),
    deadline_s: int = typer.Option(300, "--deadline-s", help="... within this many seconds"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show the plan; change nothing"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Publish a node release to the standing boxes: stage everywhere, then canary and waves.

    Every box is read back (what its node process runs, never the registry); a box on a newer
    release is left alone; a box not healthy by the deadline is reverted and stops the publish.
    The record in <store>/<version>/publish.json lets the same command resume.
    """
    from fleet.boxes.inventory import build
    from fleet.ops import publish as pub

    c = cfg()
    opts = pub.Options(version=version, role=role, canary=canary, waves=waves, soak_s=soak,
                       allow_downgrade=tuple(allow_downgrade), stable_s=stable_s,
                       deadline_s=deadline_s, dry_run=dry_run)
    # the input first: nothing is asked of a provider or a box for a command that is wrong
    from fleet.state import releases

    rel = releases.find(c.releases, version)
    releases.check_usable(rel)
    pub.parse_waves(waves)
    if canary:
        check_label(canary)
    for label in allow_downgrade:
        check_label(label)
    built = build(c, common.providers())
    hosts = pub.select(c, built.groups, built.down, opts)
    res = pub.publish(c, hosts, opts)
    if dry_run:
        caption = "waves: " + (" | ".join(", ".join(w) for w in res.waves) or "none")
    else:
        n = len(res.switched_now)
        caption = (f"{n} box{'es' if n != 1 else ''} switched now; record "
                   f"{res.record.path if res.record else '-'}")
    emit(publish_table(res.release, res.rows, dry_run, caption), res.to_dict(), as_json)
    if not res.ok:
        err.print(f"error: publish {res.release.version} failed: {res.failure}",
                  highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)


def publish_table(release: Release, rows: Sequence[BoxRow], dry_run: bool,
                  caption: str) -> Table:
    """`fleet publish`'s read-back table: one row per box, as `cells` reads it."""
    title = f"publish {release.version} (node {release.node_sha16})" + (
        " - dry run" if dry_run else "")
    return tables.build(title, PUBLISH_COLUMNS,
                        [dict(zip(PUBLISH_COLUMNS, cells(row), strict=True)) for row in rows],
                        caption=caption)


PUBLISH_COLUMNS = ("box", "state", "version", "node sha16 (of)", "after pointer", "miner",
                   "prover", "pointer", "synced after", "down: exit→up / →synced", "manifest")


def _short(sha: Any) -> str:
    return str(sha)[:16] if sha else "-"


def _yes(v: Any) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def _secs(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f} s"


def _prog(sha: str | None, version: str | None) -> str:
    return f"{_short(sha)} ({version or 'unknown'})" if sha else "-"


def _pointer(row: BoxRow) -> str:
    """The pointer's target as `releases/<sha16>`: its last two folders."""
    ptr = row.get("pointer") or "-"
    if ptr != "-":
        ptr = "/".join(ptr.rsplit("/", 3)[-3:-1]) if ptr.count("/") >= 2 else ptr
    return ptr


def cells(row: BoxRow) -> list[str]:
    """One box's row of a publish (`publish.table_row`) as the operator reads it."""
    kind = row.get("node_kind") or "?"
    node = f"{_short(row.get('node_sha256'))} ({kind})" if row.get("node_sha256") else "-"
    state = row["state"] + (f": {row['note']}" if row.get("note") and row["state"] != "switched"
                            else "")
    if row["state"] == "switched":
        check = "ok" if row.get("matches_manifest") else "MISMATCH: " + "; ".join(
            row.get("problems") or [])
    else:
        check = "-"
    return [row["label"], state, row.get("version") or "-", node,
            _yes(row.get("started_after_pointer")),
            _prog(row.get("miner_sha256"), row.get("miner_version")),
            _prog(row.get("prover_sha256"), row.get("prover_version")),
            _pointer(row), _secs(row.get("synced_after_s")),
            f"{_secs(row.get('gap_s'))} / {_secs(row.get('downtime_s'))}"
            if row.get("gap_s") is not None else "-", check]


# --- the sandbox: the only commands that know it exists -------------------------------------
