"""`fleet check` and `fleet converge`: are the standing boxes well, and make them so."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.table import Table

from fleet.core.errors import UsageError

if TYPE_CHECKING:
    pass

from fleet.cli import common
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
    t = Table(title="standing boxes")
    for col in ("label", "ssh", "agent", "synced", "blocks", "exec tip", "prover", "admission",
                "node", "verdict"):
        t.add_column(col)
    for h in results:
        node = h.node_sha16 or "-"
        if h.wanted_sha16:
            node += " ok" if h.node_sha16 == h.wanted_sha16 else f" (wanted {h.wanted_sha16})"
        tip = "-" if h.exec_tip is None else f"{h.exec_tip}{'' if h.exec_moving else ' stuck'}"
        t.add_row(h.label, "ok" if h.ssh else "DOWN", "up" if h.agent else "DOWN",
                  str(h.synced), str(h.blocks), tip, h.prover or "-",
                  "ok" if h.admitted else f"refused: {h.admission_reason}", node,
                  "well" if h.well else "; ".join(h.problems))
    if not results:
        t.caption = "no standing boxes in the inventory"
    emit(t, [{"kind": "standing", **h.to_dict()} for h in results]
         + [{"kind": "oneshot", **w.to_dict()} for w in watched], as_json)
    if watched and not as_json:
        w_table = Table(title="one-shot boxes (meter watchdog)")
        for col in ("label", "job", "phase", "age", "TTL left", "verdict"):
            w_table.add_column(col)
        for w in watched:
            left = "-" if w.ttl_left_min is None else f"{w.ttl_left_min:.0f} min"
            w_table.add_row(w.label, w.job or "-", w.phase or "-", f"{w.age_min:.0f} min", left,
                            "well" if w.well else "; ".join(w.problems))
        out.print(w_table)
    if any(not h.well for h in results) or any(not w.well for w in watched):
        raise typer.Exit(1)


@app.command("converge")
def converge_cmd(
    role_kind: str = typer.Argument(..., help="what to converge: standing"),
    dry: bool = typer.Option(False, "--dry", help="show what would change, change nothing"),
) -> None:
    """Run the deploy for ROLE_KIND, then the testinfra checks against the same inventory."""
    from fleet.ops.converge import converge_all

    if role_kind != "standing":
        raise UsageError(f"nothing to converge for {role_kind!r} (standing)")
    converge_all(cfg(), dry=dry)


# --- releases and publishing ----------------------------------------------------------------
