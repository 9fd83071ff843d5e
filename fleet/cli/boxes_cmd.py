"""`fleet offers`, `rent`, `roster` and `destroy`: the boxes themselves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import typer
from rich.table import Table

from fleet.boxes import lifecycle
from fleet.cli import common, tables
from fleet.cli.common import (
    app,
    card_option,
    cfg,
    emit,
    err,
    out,
    registry,
    uptime,
)
from fleet.core.boxes import Row
from fleet.core.config import PROVIDERS, Config
from fleet.core.errors import AuthFailed, FleetError, ProviderError, UsageError
from fleet.core.verdicts import Health, Owed
from fleet.ops import budget, destroy, spread
from fleet.ops import offers as offers_mod
from fleet.ops import rent as rent_mod
from fleet.providers.base import Box, Offer, Provider
from fleet.providers.sync import view
from fleet.state import last_tick
from fleet.state.last_tick import LastTick
from fleet.state.registry import Registry, check_label


@app.command("offers")
def offers_cmd(role: str, card: str = typer.Option(None, help="only this card, e.g. 'RTX 4090'"),
               gpus: int = typer.Option(1, min=1), limit: int = typer.Option(10, min=1),
               as_json: bool = typer.Option(False, "--json")) -> None:
    """The cheapest admissible offers for ROLE across both providers."""
    wanted = card_option(card)
    r = cfg().role(role)
    found, failures = offers_mod.search(r, common.providers().values(), card=wanted, gpus=gpus)
    for f in failures:
        err.print(f"warning: {f}")
    rows = found[:limit]
    emit(offers_table(role, r.admitted_driver, rows),
         [{k: v for k, v in o.__dict__.items() if k != "raw"} for o in rows], as_json)


OFFER_COLUMNS = ("provider", "offer", "card", "gpus", "USD/h", "driver", "cuda", "where")


def offers_table(role: str, driver: str | None, offers: Sequence[Offer]) -> Table:
    """`fleet offers`' table, from the offers alone (no provider asked: a test renders it)."""
    return tables.build(f"offers for {role} (driver {driver or 'any'})", OFFER_COLUMNS,
                        [offer_row(o) for o in offers])


def offer_row(o: Offer) -> dict[str, str]:
    """An offer's cells; a driver only a booted box reports reads as such, not as missing."""
    return {"provider": o.provider, "offer": o.offer_id, "card": o.card,
            "gpus": str(o.gpu_count), "USD/h": f"{o.usd_per_hour:.3f}",
            "driver": o.driver or "(after boot)",
            "cuda": o.cuda or (f"ROCm {o.rocm}" if o.rocm else ""),
            "where": o.country or o.cloud or ""}


@app.command("rent")
def rent_cmd(role: str, provider: str = typer.Option(None, help="runpod or vast"),
             card: str = typer.Option(None), gpus: int = typer.Option(1, min=1),
             label: str = typer.Option(None, help="label to use (default: generated)"),
             wait: bool = typer.Option(True, help="wait until SSH answers and pin its host key"),
             dry_run: bool = typer.Option(False, "--dry-run"),
             as_json: bool = typer.Option(False, "--json"),
             new_fleet: bool = typer.Option(False, "--new-fleet", help="rent into an empty "
                                            "registry although the account lists another "
                                            "fleet's boxes")) -> None:
    """Rent one box for ROLE: cheapest admissible offer, within the daily budget.

    With the --label of a rent that stopped half-way (a crash while renting or waiting for
    SSH), resume it: the box its provider lists under the label is recorded and waited for;
    if there is none, the label is rented again there (budget checked).
    """
    wanted = card_option(card)
    c, reg = cfg(), registry()
    r = c.role(role)
    if provider and provider not in PROVIDERS:
        raise UsageError(f"unknown provider {provider!r} (runpod, vast)")
    old = None
    if label:
        check_label(label)
        old = reg.get(label)
        if old is not None:
            lifecycle.check_resume(old, r, provider)
    if old is not None:
        ps = _providers()
        again = f"fleet rent {role} --label {label}"
        p = lifecycle.provider_for(ps, old.provider, f"cannot resume {label}")
        try:
            box = lifecycle.find_unfinished(p, old)
        except ProviderError as e:
            raise lifecycle.cannot_ask(e, old.label, again) from None
        if box is not None:
            if dry_run:
                out.print(f"dry run: would resume {old.label}: record {old.provider} box "
                          f"{box.box_id} ({box.status}) and wait for SSH")
                return
            row = lifecycle.record(reg, old.label, box)
            _rented(c, reg, ps, row.label, wait, as_json)
            return
        chosen = {old.provider: p}
    elif provider:
        ps = _providers()
        chosen = {provider: lifecycle.provider_for(ps, provider, f"cannot rent on {provider}")}
    else:
        ps = chosen = common.providers()  # no key at all: AuthFailed names the variables
    if not new_fleet:  # an empty registry beside another fleet: a wrong path, exit 2
        rent_mod.other_fleets(reg, ps)
    found, failures = offers_mod.search(r, chosen.values(), card=wanted, gpus=gpus)
    for f in failures:
        err.print(f"warning: {f}")
    if dry_run:
        _would_rent(c, reg, ps, role, found, old)
        return
    res = rent_mod.rent(c, reg, r, found, ps, label=label, resume=old is not None)
    _rented(c, reg, ps, res.row.label, wait, as_json)


def _would_rent(c: Config, reg: Registry, ps: dict[str, Provider], role: str,
                found: Sequence[Offer], old: Row | None) -> None:
    """A dry run's rent: the offer it would take and the day projected with it."""
    if not found:
        raise FleetError(f"no admissible offer for {role}")
    o = found[0]
    rows = reg.rows()
    what = f"renting for role {role!r}"
    day = budget.project_new(rows, c.daily_budget_usd, o.usd_per_hour,
                             replacing=old.label if old else None,
                             unowned=budget.unowned_boxes(rows, budget.listed(ps, what), what))
    verdict = "fits" if day.fits else "would be REFUSED"
    resumed = f" under the unfinished label {old.label}" if old else ""
    out.print(f"dry run: would rent {o.card} x{o.gpu_count} on {o.provider} "
              f"(offer {o.offer_id}) at ${o.usd_per_hour:.3f}/h{resumed}; projected day "
              f"${day.total_usd:.2f}, run rate ${day.run_rate_usd:.2f} a day, of "
              f"${day.budget_usd:.2f}: {verdict}")


def _providers() -> dict[str, Provider]:
    """The providers with a key; none at all is an empty dict (the caller names the key)."""
    try:
        return common.providers()
    except AuthFailed:
        return {}


def _rented(c: Config, reg: Registry, ps: dict[str, Provider], label: str, wait: bool,
            as_json: bool) -> None:
    """Wait for the rented box (unless told not to) and show its row."""
    row = rent_mod.wait_ready(c, reg, ps, [label])[label] if wait else reg.get(label)
    if row is None:
        raise FleetError(f"{label}: its registry row went missing while renting")
    emit(rented_table(row), row.to_dict(), as_json)


RENTED_COLUMNS = ("label", "provider", "id", "card", "USD/h", "status", "ssh")


def rented_table(row: Row) -> Table:
    """The rented box's registry row as `fleet rent` shows it."""
    return tables.build("rented", RENTED_COLUMNS, [{
        "label": row.label, "provider": row.provider, "id": row.provider_id or "",
        "card": row.card, "USD/h": f"{row.usd_per_hour:.3f}", "status": row.status,
        "ssh": f"{row.ssh_host}:{row.ssh_port}"}])


@app.command("roster")
def roster_cmd(
    as_json: bool = typer.Option(False, "--json"),
    all_rows: bool = typer.Option(False, "--all", help="include destroyed boxes"),
) -> None:
    """The fleet's boxes with their live status and what they cost."""
    c, reg, ps = cfg(), registry(), common.providers()
    v = view(reg, ps)
    for f in v.failures:
        err.print(f"warning: {f}")
    for u in v.unreadable:
        err.print(f"warning: {u}")
    live = {row.label: box for row, box in v.matched}
    gone = {r.label for r in v.gone}
    every = reg.rows()
    rows = [r for r in every if all_rows or r.live]
    places = spread.per_place(every)
    tick = _fresh_tick(c, reg)
    cells: list[dict[str, str]] = []
    data = []
    for r in rows:
        box = live.get(r.label)
        status = box.status if box else ("gone" if r.label in gone else r.status)
        h = _peers_of(tick, r)
        cells.append(roster_row(r, status, places, h))
        data.append({**r.to_dict(), "live_status": status,
                     "peers": None if h is None else {"in": h.peers_in, "out": h.peers_out,
                                                      "star_only": h.star_only,
                                                      "port_owed": h.port_owed}})
    cells += [orphan_row(b) for b in v.orphans]
    owed = _owed(reg)
    cells += [owed_row(o) for o in owed]
    money = _money(c, reg, ps)
    cost = budget.rate(r.usd_per_hour for r in rows if r.live)
    t = roster_table(cells, roster_caption(cost.usd_per_hour, money) + "; " + peers_caption(tick))
    emit(t, {"boxes": data, "orphans": [b.to_dict() for b in v.orphans],
             "owed": [o.for_page().to_dict() | {"rerent_of": o.rerent_of} for o in owed],
             "usd_per_hour": cost.usd_per_hour, "usd_per_day": cost.usd_per_day, "money": money,
             "places": places,
             "peers_from": None if tick is None else {"tick": tick.number, "at": tick.at}},
         as_json)


ROSTER_COLUMNS = ("label", "role", "kind", "provider", "card", "machine", "USD/h", "uptime",
                  "status", "in/out", "job")


def roster_table(rows: Sequence[Mapping[str, str]], caption: str) -> Table:
    """`fleet roster`'s table from its rows' cells (`roster_row`, `orphan_row`, `owed_row`):
    a column is one name in ROSTER_COLUMNS and one key where its rows are made."""
    return tables.build("roster", ROSTER_COLUMNS, rows, caption=caption)


def roster_row(r: Row, status: str, places: Mapping[str, int] | None = None,
               h: Health | None = None) -> dict[str, str]:
    """A registry row's cells; `status` is what its provider lists now (or the registry's);
    `places`: how many live boxes each place holds (`spread.per_place`); `h`: the loop's
    last check of it (its p2p peers in/out), where a fresh tick checked it."""
    held = (places or {}).get(r.place or "", 0)
    where = "-" if not r.place else spread.short(r.place) + (f" ({held} boxes)" if held > 1
                                                            else "")
    return {"label": r.label, "role": r.role, "kind": r.kind, "provider": r.provider,
            "card": r.card, "machine": where, "USD/h": f"{r.usd_per_hour:.3f}",
            "uptime": uptime(r.created_at) if r.live else "-",
            "status": status + (" (standing)" if r.standing else ""),
            "in/out": h.peers_word() if h is not None else "-", "job": _job_cell(r)}


def orphan_row(b: Box) -> dict[str, str]:
    """A box a provider bills that no registry row claims."""
    return {"label": b.label or "?", "provider": b.provider, "card": b.card,
            "USD/h": f"{b.usd_per_hour:.3f}" if b.priced else "unknown",
            "status": f"ORPHAN {b.box_id}"}


def owed_row(o: Owed) -> dict[str, str]:
    """A box the loop owes the roster: no label yet."""
    return {"role": o.role, "kind": "owed", "provider": o.provider,
            "card": f"{o.card} x{o.gpus}", "status": f"OWED since {o.since}: {o.reason}"}


def roster_caption(total: float, money: Mapping[str, Any]) -> str:
    """What the live boxes cost an hour and a day, and the day's money (`budget.today`)."""
    return (f"total ${total:.3f}/h, ${budget.Rate(total).usd_per_day:.2f}/day; spent today "
            f"${money['spent_today_usd']:.2f} ({money['boxes_from_bills']} boxes from the "
            f"bills), committed until midnight ${money['committed_until_midnight_usd']:.2f}"
            f", run rate ${money['run_rate_usd_per_day']:.2f}/day, budget "
            f"${money['daily_budget_usd']:.2f}")


def _fresh_tick(c: Config, reg: Registry) -> LastTick | None:
    """The loop's last tick, where it is fresh (`LastTick.stale`): the peers it read."""
    tick = last_tick.load(reg.path)
    return None if tick is None or tick.stale(datetime.now(UTC), c.loop.interval_s) else tick


def _peers_of(tick: LastTick | None, r: Row) -> Health | None:
    """The tick's check of `r`, where it is this box's: a live standing box of the same
    provider, checked after its rent and not since seen stopped (the page's rule)."""
    h = tick.verdict(r.label) if tick is not None and r.live and r.standing else None
    if h is None or tick is None or h.provider != r.provider or r.stopped_at is not None \
            or not r.created_at or tick.at < r.created_at:
        return None
    return h


def peers_caption(tick: LastTick | None) -> str:
    if tick is None:
        return "in/out: no fresh loop tick on record (fleet check reads the peers now)"
    return f"in/out: the p2p peers of the loop's tick {tick.number} at {tick.at}"


def _money(c: Config, reg: Registry, ps: dict[str, Provider]) -> dict[str, Any]:
    """Spent today (the providers' bills where they give one), committed, the budget."""
    from fleet.state import bills

    now = datetime.now(UTC)
    read = bills.refresh(c.registry, ps, now)
    for name, why in read.errors.items():
        err.print(f"warning: no bill from {name} ({why}); its boxes are estimated")
    rows = reg.rows()
    return budget.today(rows, c.daily_budget_usd, now, bills.billed(rows, read, now)).to_dict()


def _owed(reg: Registry) -> list[Owed]:
    """The wanted boxes the loop's last tick could not rent (none before a loop ran)."""
    from fleet.state.loop_memory import Memory

    return Memory.load(reg.path).owed


def _job_cell(r: Row) -> str:
    """A one-shot row's job and what became of it; a refusal reads as a fault, not a result."""
    if not r.job:
        return "-"
    state = r.job_state or "staged"
    if r.refusal:
        state = f"REFUSED ({r.refusal}), 0 invocations"
    if r.teardown:
        state += f"; {r.teardown}"
    return f"{r.job}: {state}"


def _destroy_dry_run(c: Config, reg: Registry, label: str, force: bool) -> None:
    """What `fleet destroy LABEL` would destroy, or the refusal it would meet; nothing changed."""
    row = destroy.guard(c, reg, _providers(), destroy.Order(label, force=force))
    if row.provider_id:
        out.print(f"dry run: would destroy {label} ({row.provider} {row.provider_id}, "
                  f"${row.usd_per_hour:.3f}/h)")
        return
    p = lifecycle.provider_for(_providers(), row.provider, f"cannot destroy {label}")
    try:
        box = p.find_by_label(label)
    except ProviderError as e:
        raise lifecycle.cannot_ask(e, label, f"fleet destroy {label}") from None
    what = f"{row.provider} {box.box_id}" if box else f"no box at {row.provider} carries it"
    out.print(f"dry run: would destroy {label} ({what}, ${row.usd_per_hour:.3f}/h)")


@app.command("destroy")
def destroy_cmd(label: str,
                force: bool = typer.Option(False, help="also destroy a standing box, or a "
                                           "one-shot box whose outputs were not read back"),
                dry_run: bool = typer.Option(False, "--dry-run"),
                gone: bool = typer.Option(False, "--gone", help="its box is gone at its "
                                          "provider (checked in the console) though the "
                                          "fleet's key cannot see it: mark the row vanished, "
                                          "destroy nothing")) -> None:
    """Destroy the box LABEL (boxes of standing roles only with --force).

    A row without a provider id (a rent stopped before it learnt one) is looked up by its
    label at its provider; the row is marked destroyed once the provider lists no such box.
    """
    c, reg = cfg(), registry()
    check_label(label)
    if gone and dry_run:
        raise UsageError("--gone and --dry-run: choose one (--gone changes only the row)")
    if gone:
        destroy.mark_gone(reg, _providers(), label, force=force)
        out.print(f"marked {label} vanished: its box is gone at its provider, by your word")
        return
    if dry_run:
        _destroy_dry_run(c, reg, label, force)
        return
    destroy.destroy(c, reg, _providers(), destroy.Order(label, force=force))
    out.print(f"destroyed {label}")
