"""`fleet loop`: keep the standing fleet up (see `fleet.ops.loop`)."""

from __future__ import annotations

import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path

import typer

from fleet.cli import common
from fleet.cli.common import app, cfg
from fleet.core.config import LOOP_MAX_S, Config, grace_problem
from fleet.core.errors import FleetError, UsageError
from fleet.core.verdicts import Health
from fleet.ops.loop import AfterTick, AfterTickNote, Tick
from fleet.state.leader import Fence, Leadership
from fleet.state.registry import Registry


@app.command("loop")
def loop_cmd(
    interval: float = typer.Option(None, "--interval", help="seconds between ticks "
                                   "(default: fleet.toml [loop] interval_s, else 60)"),
    once: bool = typer.Option(False, "--once", help="one tick, then exit"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per tick"),
    no_destroy: bool = typer.Option(False, "--no-destroy", help="report orphans, never "
                                    "destroy them"),
    page_dir: Path = typer.Option(None, "--page", help="folder for the fleet page (default: "
                                  "page/ beside the registry)"),
    new_fleet: bool = typer.Option(False, "--new-fleet", help="start a new fleet with an empty "
                                   "registry although the account lists another fleet's boxes"),
) -> None:
    """Each tick: check every standing box, replace the dead ones in the same shape, rent what
    the roster is owed, sweep orphans, rewrite the fleet page. One line per action and a
    summary per tick; with --json, one object per tick."""
    from fleet import page
    from fleet.ops import check, loop, rent, shared_check
    from fleet.ops.converge import converge, write_peers

    c = cfg()
    every = c.loop.interval_s if interval is None else interval
    most = LOOP_MAX_S["interval_s"]
    if not (math.isfinite(every) and 0 < every <= most):
        raise UsageError(f"--interval must be a positive number of seconds, at most {most:g}, "
                         f"got {interval}")
    if interval is not None and grace_problem(c.loop.orphan_grace_s, every):
        raise UsageError(
            f"--interval {every:g} leaves [loop] orphan_grace_s ({c.loop.orphan_grace_s:g}) "
            f"under two intervals; use --interval {c.loop.orphan_grace_s / 2:g} or less, or "
            f"raise orphan_grace_s in {c.path} to {2 * every:g} or more")
    target = page.prepare(page_dir if page_dir is not None else c.registry.parent / "page")
    ps = common.providers()  # no key at all: one line naming the variables, exit 2
    reg = Registry(c.registry)
    if not new_fleet:  # an empty registry beside another fleet: a wrong path, exit 2
        rent.other_fleets(reg, ps)

    def make(fence: Fence) -> loop.Loop:
        return loop.Loop(c, ps, destroy_orphans=not no_destroy, check_fn=check.check,
                         converge_fn=converge, peers_fn=write_peers,
                         after_tick=page_after_tick(c, target, fence),
                         echo=(lambda _line: None) if as_json else _say, fence=fence)

    def emit(t: loop.Tick) -> None:
        if as_json:
            print(json.dumps(t.to_dict()), flush=True)
        else:
            _say(t.summary())

    def standby_work() -> int:
        """Its share of the leader's checks (PostgreSQL): a failure is said, never fatal."""
        try:
            return shared_check.work(c, check.check)
        except Exception as e:  # noqa: BLE001 - a standby's share never ends its campaign
            _note(f"standby: shared checks: {type(e).__name__}: {e}")
            return 0

    leading = Leadership(reg.db)
    try:
        loop.lead(leading, make, every, once, emit, _note,
                  standby_work=standby_work if reg.db.postgres else None)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        leading.resign()


def _say(line: str) -> None:
    print(line, flush=True)  # a log stream: no wrapping, no markup


def _note(line: str) -> None:
    """The loop's lead, taken, waited for or lost: on stderr, so --json's stdout stays JSON."""
    print(line, file=sys.stderr, flush=True)


def page_after_tick(c: Config, target: Path, fence: Fence | None = None) -> AfterTick:
    """The loop's after-tick hook: the tick saved in the fleet's state (its number and time,
    every verdict, the owed boxes), which a page drawn without provider keys
    shows; then the fleet page from the tick's verdicts, its owed boxes and the bills the tick
    refreshed, with the one-shot boxes watched now."""
    from fleet import page
    from fleet.ops import watchdog
    from fleet.state import bills, last_tick

    def write(t: Tick, health: list[Health]) -> None:
        owed = [o.for_page() for o in t.owed]
        try:
            last_tick.save(c.registry, t.number, t.started_at, health, owed, t.provider_errors,
                           fence=fence)
        except (OSError, FleetError) as e:  # a full disk: the page is still worth writing
            unsaved: Exception | None = e
        else:
            unsaved = None
        reg = Registry(c.registry)
        now = datetime.now(UTC)
        rows = reg.rows()
        cached = bills.load(c.registry)
        data = page.build(page.PageInputs(
            c, rows, health, watchdog.watch(c, reg), now,
            billed=bills.billed(rows, cached, now),
            owed=owed, interval_s=c.loop.interval_s,
            check_error="; ".join(t.provider_errors) or None,
            bills_at=cached.read_at if cached else None))
        page.write(target, data)
        if unsaved is not None:
            raise AfterTickNote(f"written, but not the last tick ({unsaved})")

    return write
