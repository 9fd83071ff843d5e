"""`fleet page`: write the fleet page (index.html and fleet.json) from the registry and checks."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.table import Table

from fleet.cli import common
from fleet.cli.common import app, cfg, emit, registry
from fleet.core.errors import FleetError
from fleet.core.verdicts import VERDICTS, Health


@app.command("page")
def page_cmd(out_dir: Path = typer.Option(None, "--out", help="folder for index.html and "
                                          "fleet.json (default: page/ beside the registry)"),
             as_json: bool = typer.Option(False, "--json", help="print the page's JSON")
             ) -> None:
    """Write the fleet page: standing boxes, every live box's verdict, owed boxes, money today
    and USD/h over the last 7 days, as a static, self-contained index.html and its fleet.json.

    Standing boxes are checked (as `fleet check`) and one-shot boxes watched first; when there
    are none, no provider is asked. Both files are replaced whole (temp file and rename).
    """
    from fleet import page

    c = cfg()
    # a folder that cannot take the page is refused before anything is asked or written
    target = page.prepare(out_dir if out_dir is not None else c.registry.parent / "page")
    reg = registry()
    live = [r for r in reg.rows() if r.live]
    health: list[Health] = []
    check_error = None
    if any(r.kind == "standing" for r in live):
        from fleet.boxes.inventory import build
        from fleet.ops import check as check_mod

        ps = common.providers()  # no key at all is the operator's to fix: one line, exit 2
        try:
            health = check_mod.check(c, build(c, ps))
        except FleetError as e:
            if e.exit_code == 2:
                raise
            check_error = str(e)  # a provider failing: the page says so, verdicts unknown
    from fleet.state.loop_memory import Memory

    owed = [o.for_page() for o in Memory.load(c.registry.parent / "loop.json").owed]
    from fleet.ops import watchdog

    data = page.build(c, reg.rows(), health, watchdog.watch(c, reg), datetime.now(UTC),
                      check_error=check_error, owed=owed)
    html_path = page.write(target, data)[1]
    t = Table(title=f"fleet page: {html_path}")
    for col in ("boxes", "USD/h", "USD/day", "standing", "down", "problem", "unknown", "well",
                "owed", "spent today", "budget"):
        t.add_column(col)
    tot, money = data["totals"], data["money"]
    t.add_row(str(tot["boxes"]), f"{tot['usd_per_hour']:.3f}", f"{tot['usd_per_day']:.2f}",
              str(data["standing"]["count"]),
              *(str(tot["verdicts"][v]) for v in VERDICTS), str(tot["owed"]),
              f"${money['spent_today_usd']:.2f}", f"${money['daily_budget_usd']:.2f}")
    emit(t, data, as_json)
