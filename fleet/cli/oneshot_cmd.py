"""`fleet run`, `fleet teardown` and `fleet store`: the one-shot commands of the CLI."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table
from rich.text import Text

from fleet.cli import common, tables
from fleet.cli.common import app, cfg, emit, err, registry
from fleet.core.errors import FleetError, UsageError
from fleet.state.registry import check_label

if TYPE_CHECKING:
    from fleet.ops.oneshot import Summary
    from fleet.ops.teardown import Outcome

store_app = typer.Typer(no_args_is_help=True, help="The Hub-compatible store of toolchains "
                        "and outputs.")
app.add_typer(store_app, name="store")


def _say(line: str) -> None:
    err.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("run")
def run_cmd(role: str, job_file: Path = typer.Argument(..., metavar="JOB.toml"),
            keep: bool = typer.Option(False, "--keep", help="leave the box up after the job "
                                      "(a refused box is torn down regardless)"),
            verbose: bool = typer.Option(False, "-v", help="show pyinfra's output"),
            as_json: bool = typer.Option(False, "--json"),
            new_fleet: bool = typer.Option(False, "--new-fleet", help="rent into an empty "
                                           "registry although the account lists another "
                                           "fleet's boxes")) -> None:
    """Rent a one-shot box for ROLE, run JOB.toml on it, read its outputs back, tear it down."""
    from fleet.core import job as job_mod
    from fleet.ops import oneshot, rent

    spec = job_mod.load(job_file)  # a bad job file rents nothing
    c = cfg()
    if not verbose:  # pyinfra's own lines only with -v
        logging.getLogger("fleet.boxes.pyinfra_run").setLevel(logging.WARNING)
    reg, ps = registry(), common.providers()
    if not new_fleet:  # an empty registry beside another fleet: a wrong path, exit 2
        rent.other_fleets(reg, ps)
    s = oneshot.run(c, reg, ps, role, spec, keep=keep)
    emit(job_table(s), s.to_dict(), as_json)
    for fault in (s.problem, s.kept):
        if fault:
            err.print(f"error: {fault}", markup=False, highlight=False, soft_wrap=True)
    if s.kept:
        raise typer.Exit(1)
    if s.refusal:
        raise typer.Exit(3)
    if s.phase != "finished":
        raise typer.Exit(1)


def job_table(s: Summary) -> Table:
    """What `fleet run` did, one `what: value` line each: a table with no key column, so a
    narrow console gets those lines without the frame (`tables.fold`)."""
    t = Table(title=Text(f"job {s.job} on {s.label}"), show_header=False,
              title_justify="default")  # flush left: no line ends in spaces
    t.add_column("what")
    t.add_column("value")
    tables.add(t, "box", f"{s.label}: {s.card} on {s.provider}, ${s.usd_per_hour:.3f}/h")
    tables.add(t, "admission", f"refused: {s.refusal}" if s.refusal else tables.known(s.admission))
    tables.add(t, "verdict", s.verdict)
    tables.add(t, "invocations", tables.known(s.invocations))  # unknown is not "none ran"
    if s.toolchain:
        warm = "warm, nothing fetched" if s.toolchain.get("warm") else \
            f"{s.toolchain.get('bytes_fetched', 0)} bytes fetched"
        tables.add(t, "toolchain", f"{s.toolchain.get('repo')}@"
                  f"{str(s.toolchain.get('revision'))[:12]}: {warm}")
    for g in s.gates:
        tables.add(t, f"gate {g.get('name')}",
                   f"exit {g.get('exit_code')}, {g.get('passed')} passed")
    tables.add(t, "exit", "-" if s.exit_code is None else str(s.exit_code))
    tables.add(t, "outputs", f"{s.outputs_files} files, {s.outputs_bytes} bytes")
    tables.add(t, "store commit", s.store_commit or "-")
    tables.add(t, "box", "destroyed" if s.destroyed else f"KEPT: {s.kept}" if s.kept else "kept")
    tables.add(t, "cost", f"${s.cost_usd:.4f}")
    if s.problem:
        tables.add(t, "problem", s.problem)
    return t


@app.command("teardown")
def teardown_cmd(label: str = typer.Argument(None, help="the one-shot box"),
                 expired: bool = typer.Option(False, "--expired", help="every one-shot box the "
                                              "watchdog flags: past its deadline, its job "
                                              "ended, or no job past the grace"),
                 keep_box: bool = typer.Option(False, "--keep-box", help="read the outputs "
                                               "back but keep the box for another job"),
                 dry_run: bool = typer.Option(False, "--dry-run"),
                 as_json: bool = typer.Option(False, "--json")) -> None:
    """Read a one-shot box's outputs back (archive and store), then destroy it."""
    from fleet.ops import teardown, watchdog

    if bool(label) == expired:
        raise UsageError("name one box (LABEL) or pass --expired")
    if keep_box and expired:
        raise UsageError("--keep-box reads one box back (LABEL), not the --expired ones")
    c, reg = cfg(), registry()
    flagged: dict[str, object] = {}
    if label:
        labels = [check_label(label)]
    else:  # each with the job it was flagged for: a row given another since is left alone
        flagged = {w.label: w.job for w in watchdog.watch(c, reg) if w.due}
        labels = list(flagged)
    ps = common.providers()
    results, failures = [], []
    for lab in labels:
        try:
            results.append(teardown.teardown(
                c, reg, ps, lab, dry_run=dry_run, keep_box=keep_box,
                flagged_job=flagged.get(lab, teardown.UNCHANGED)))
        except FleetError as e:
            if label:
                raise
            failures.append(str(e))
            _say(f"error: {e}")
        except Exception as e:  # noqa: BLE001 - one box's fault never stops the pass
            if label:
                raise
            failures.append(f"{lab}: {type(e).__name__}: {e}")
            _say(f"error: {lab}: {type(e).__name__}: {e}; box kept")
    emit(teardown_table(results, dry_run, "nothing flagged" if expired and not labels else None),
         {"torn_down": [r.to_dict() for r in results], "kept": failures}, as_json)
    if failures:
        raise typer.Exit(1)


TEARDOWN_COLUMNS = ("label", "job", "phase", "files", "bytes", "store commit", "box")


def teardown_table(results: Sequence[Outcome], dry_run: bool, caption: str | None) -> Table:
    """`fleet teardown`'s table, from the teardowns' outcomes alone."""
    return tables.build("teardown" + (" - dry run" if dry_run else ""), TEARDOWN_COLUMNS,
                        [teardown_row(r) for r in results], caption=caption)


def teardown_row(r: Outcome) -> dict[str, str]:
    """A teardown's cells: what was read back, and the box destroyed or why it was kept."""
    return {"label": r.label, "job": r.job or "-", "phase": r.phase or "-",
            "files": str(r.files), "bytes": str(r.bytes), "store commit": (r.commit or "-")[:12],
            "box": "destroyed" if r.destroyed else "; ".join(r.steps) or "-"}


@store_app.command("push")
def store_push(src: Path = typer.Argument(..., help="folder to commit (a toolchain)"),
               repo: str = typer.Option(..., "--repo", help="e.g. fleet/toolchains"),
               message: str = typer.Option(None, "--message", "-m")) -> None:
    """Commit the folder SRC to REPO in one commit; print the commit id to pin in a job."""
    from fleet.providers import store

    if not src.is_dir():
        raise UsageError(f"{src}: not a folder")
    commit = store.push_toolchain(repo, src, message or f"toolchain from {src.name}")
    sys.stdout.write(json.dumps({"repo": repo, "revision": commit}) + "\n")
    _say(f"pin it in a job file: [toolchain] repo = \"{repo}\", revision = \"{commit}\"")
