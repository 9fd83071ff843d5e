"""`fleet page`: write the fleet page (index.html and fleet.json) from the registry and checks."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table
from rich.text import Text

from fleet.cli import common, tables
from fleet.cli.common import app, cfg, emit, registry
from fleet.core.config import PROVIDERS
from fleet.core.errors import AuthFailed, FleetError
from fleet.core.states import BoxKind
from fleet.core.verdicts import VERDICTS, Health

if TYPE_CHECKING:
    from fleet.core.boxes import Row
    from fleet.core.config import Config
    from fleet.core.verdicts import Owed
    from fleet.providers.base import Provider


@app.command("page")
def page_cmd(out_dir: Path = typer.Option(None, "--out", help="folder for index.html and "
                                          "fleet.json (default: page/ beside the registry)"),
             as_json: bool = typer.Option(False, "--json", help="print the page's JSON")
             ) -> None:
    """Write the fleet page: standing boxes, every live box's verdict, owed boxes, money today
    and USD/h over the last 7 days, as a static, self-contained index.html and its fleet.json.

    Standing boxes are checked (as `fleet check`) and one-shot boxes watched first; when there
    are none, no provider is asked. The standing boxes of a provider this machine has no key
    for are not checked: they show the loop's last tick (last_tick.json beside the registry),
    dated by it, and so do the owed boxes; the page says so at its top. Money is from the bills
    the loop cached (bills.json), never asked afresh here. Both files are replaced whole (temp
    file and rename).
    """
    from fleet import page
    from fleet.state import bills, last_tick

    c = cfg()
    # a folder that cannot take the page is refused before anything is asked or written
    target = page.prepare(out_dir if out_dir is not None else c.registry.parent / "page")
    reg = registry()
    live = [r for r in reg.rows() if r.live]
    health: list[Health] = []
    check_error = None
    keyless: list[str] = []
    if any(r.kind == BoxKind.STANDING for r in live):
        ps = _keyed_providers()
        keyless = [p for p in PROVIDERS if p not in ps]
        try:
            health = _check(c, ps)
        except FleetError as e:
            if e.exit_code == 2:
                raise  # a key refused (not missing) is the operator's to fix: exit 2
            check_error = str(e)  # a provider failing: the page says so, verdicts unknown
    tick = last_tick.load(c.registry) if keyless else None
    from fleet.ops import watchdog

    now = datetime.now(UTC)
    rows = reg.rows()
    cached = bills.load(c.registry)
    data = page.build(page.PageInputs(
        c, rows, health, watchdog.watch(c, reg), now, check_error=check_error,
        owed=_owed(c, live, keyless), keyless=keyless, last_tick=tick,
        billed=bills.billed(rows, cached, now),
        bills_at=cached.read_at if cached else None))
    html_path = page.write(target, data)[1]
    emit(_summary(html_path, data), data, as_json)


def _keyed_providers() -> dict[str, Provider]:
    """The providers this machine has a key for: none at all is no error here (the page is
    drawn from the loop's last tick instead)."""
    try:
        return common.providers()
    except AuthFailed:  # raised only when no provider has a key here (nothing is asked yet)
        return {}


def _check(c: Config, ps: dict[str, Provider]) -> list[Health]:
    """`fleet check` over the boxes of the providers with a key; none: nothing is checked."""
    if not ps:
        return []
    from fleet.boxes.inventory import build
    from fleet.ops import check as check_mod

    return check_mod.check(c, build(c, ps))


def _owed(c: Config, live: list[Row], keyless: list[str]) -> list[Owed]:
    """The loop's owed boxes from its memory, when every standing box is checked here (when a
    provider's key is missing, the page takes them from the last tick, with its time)."""
    if any(r.kind == BoxKind.STANDING and r.provider in keyless for r in live):
        return []
    from fleet.state.loop_memory import Memory

    return [o.for_page() for o in Memory.load(c.registry).owed]


def _summary(html_path: Path, data: dict[str, Any]) -> Table:
    """The one-line table: counts, money, and where the standing verdicts come from."""
    from fleet import page

    t = Table(title=Text(f"fleet page: {html_path}"), title_justify="default")
    for col in ("boxes", "USD/h", "USD/day", "standing", "down", "problem", "unknown", "well",
                "owed", "spent today", "budget", "verdicts"):
        t.add_column(col)
    tot, money = data["totals"], data["money"]
    tables.add(t, str(tot["boxes"]), f"{tot['usd_per_hour']:.3f}", f"{tot['usd_per_day']:.2f}",
              str(data["standing"]["count"]),
              *(str(tot["verdicts"][v]) for v in VERDICTS),
              tables.known(tot["owed"]),
              f"${money['spent_today_usd']:.2f}", f"${money['daily_budget_usd']:.2f}",
              page.verdicts_from(data))
    return t
