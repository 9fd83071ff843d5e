"""`fleet check` and `fleet converge`: are the standing boxes well, and make them so."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from fleet.core.errors import UsageError
from fleet.core.states import BoxKind

if TYPE_CHECKING:
    from fleet.core.verdicts import Health, Watch

from fleet.cli import common, tables
from fleet.cli.common import app, cfg, emit, out, registry


@app.command("check")
def check_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
    """Is every standing box well (SSH, agent, sync, exec tip, prover, admission, node binary),
    and does every one-shot box still earn its meter (TTL, job ended, outputs verified)?"""
    from fleet.boxes.inventory import build
    from fleet.ops import check as check_mod
    from fleet.ops import watchdog

    c = cfg()
    results = check_mod.check(c, build(c, common.providers()))
    watched = watchdog.watch(c, registry())
    emit(standing_table(results), [{"kind": "standing", **h.to_dict()} for h in results]
         + [{"kind": "oneshot", **w.to_dict()} for w in watched], as_json)
    if watched and not as_json:
        tables.show(out, watchdog_table(watched))
    if any(not h.well for h in results) or any(not w.well for w in watched):
        raise typer.Exit(1)


STANDING_COLUMNS = ("label", "ssh", "agent", "synced", "blocks", "exec tip", "peers in/out",
                    "prover", "admission", "node", "verdict")
WATCHDOG_COLUMNS = ("label", "job", "phase", "age", "TTL left", "verdict")


def standing_table(results: Sequence[Health]) -> Table:
    """The standing boxes' checks as `fleet check` shows them (a test renders it from plain
    verdicts, no box asked)."""
    caption = None if results else "no standing boxes in the inventory"
    return tables.build("standing boxes", STANDING_COLUMNS, [standing_row(h) for h in results],
                        caption=caption)


def standing_row(h: Health) -> dict[str, str | None]:
    """A standing box's cells: what each check found, the node against the one wanted. What
    a box that did not answer could not tell is unknown (`?`), never a verdict: its agent is
    not down, its admission not refused, for all the fleet knows."""
    if not h.ssh:
        return {"label": h.label, "ssh": "hung" if h.hung else "DOWN",
                "peers in/out": h.peers_word(), "verdict": _verdict(h.well, h.problems),
                **dict.fromkeys(("agent", "synced", "blocks", "exec tip", "prover",
                                 "admission", "node"), tables.UNKNOWN)}
    node = h.node_sha16 or "-"
    if h.wanted_sha16:
        node += " ok" if h.node_sha16 == h.wanted_sha16 else f" (wanted {h.wanted_sha16})"
    tip = "-" if h.exec_tip is None else f"{h.exec_tip}{'' if h.exec_moving else ' stuck'}"
    return {"label": h.label, "ssh": "ok", "agent": "up" if h.agent else "DOWN",
            "synced": tables.known(h.synced), "blocks": tables.known(h.blocks),
            "exec tip": tip, "peers in/out": h.peers_word(), "prover": h.prover or "-",
            "admission": admission(h.admitted, h.admission_reason), "node": node,
            "verdict": _verdict(h.well, h.problems)}


def admission(admitted: bool | None, reason: str | None) -> str:
    """`ok`, `refused: why`, or `?` where the box's admission is not known."""
    if admitted is None:
        return tables.UNKNOWN
    return "ok" if admitted else f"refused: {tables.known(reason)}"


def _verdict(well: bool, problems: Sequence[str]) -> str:
    return "well" if well else "; ".join(problems)


def watchdog_table(watched: Sequence[Watch]) -> Table:
    """The one-shot boxes the meter watchdog looked at, and what it found."""
    return tables.build("one-shot boxes (meter watchdog)", WATCHDOG_COLUMNS,
                        [watch_row(w) for w in watched])


def watch_row(w: Watch) -> dict[str, str]:
    """A one-shot box's cells: its job, how long it has billed, how long it may still."""
    left = "-" if w.ttl_left_min is None else f"{w.ttl_left_min:.0f} min"
    return {"label": w.label, "job": w.job or "-", "phase": w.phase or "-",
            "age": f"{w.age_min:.0f} min", "TTL left": left,
            "verdict": _verdict(w.well, w.problems)}


@app.command("converge")
def converge_cmd(
    role_kind: str = typer.Argument(..., help="what to converge: standing"),
    dry: bool = typer.Option(False, "--dry", help="show what would change, change nothing"),
) -> None:
    """Run the deploy for ROLE_KIND, then the testinfra checks against the same inventory."""
    from fleet.ops.converge import converge_all

    if role_kind != BoxKind.STANDING:
        raise UsageError(f"nothing to converge for {role_kind!r} (standing)")
    converge_all(cfg(), dry=dry)


# --- releases and publishing ----------------------------------------------------------------
