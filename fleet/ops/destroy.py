"""The one way a box is destroyed: every destroy in the fleet's code goes through `destroy`.

It applies, in this order, and stops at the first that refuses:
1. ownership: the registry has a row under the label (every rent writes its row before the
   create), and a box other than the row's own (an orphan under its label) is destroyed only
   where its provider lists it under that very label and the label has this fleet's exact
   form (`fleet.core.labels`: its fleet id); a row with no box id is destroyed by its label
   only where the label has that form too (else with `--force`: a person's box may carry it);
2. the standing guard: a box of a standing role goes only on the loop's own judgement or an
   operator's `--force`;
3. the unread-outputs guard: a one-shot box whose job's outputs were not read back goes only
   with `--force`;
4. the row read again under the registry's lock: still live, still on the box the caller
   judged (a rent or a resume may have moved it on since);
5. the disruption budget, for the loop's judgements (its `spend`, saved before the destroy);
6. the destroy, its box confirmed gone by id, and the row marked destroyed in one locked step
   with the check that it still names that box (a rent resumed meanwhile keeps its row).

A refusal is a `Refused` (one line, exit status 2 at the CLI), before anything changed. A
provider that fails, or still lists the box, is a ProviderError: the row stays live (the box
may still bill), and the caller says so and tries again.

`mark_gone` is the operator's way out where the fleet's key cannot see a row's box (it opens
another account): a person who checked the provider's console says the box is gone, and the
row is marked vanished, never while the key still shows the box.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet.boxes import lifecycle, sshmux
from fleet.core import labels
from fleet.core.boxes import Row, is_standing, unfinished, unread
from fleet.core.errors import ProviderError, UsageError
from fleet.core.states import BoxStatus
from fleet.core.times import now_iso

if TYPE_CHECKING:
    from fleet.core.config import Config
    from fleet.providers.base import Provider
    from fleet.state.registry import Registry


class Refused(UsageError):
    """A destroy a guard refused: nothing was changed."""


@dataclass(frozen=True)
class Order:
    """One destroy, as its caller asks it.

    label: the registry row that owns the box.
    box_id: a box other than the row's own (an orphan, or a second box, under its label);
        None: the row's own box, by its recorded id (or by its label while it has none).
    seen_id: the row's box id as the caller judged it (the re-read must still show it).
    judged: the loop's own judgement (a dead box, a move, a sweep): the standing guard is
        the loop's, and `spend` applies. force: an operator's `--force`, or a box its own
        rent undoes (never converted): the standing and unread-outputs guards are waived.
    also: more changes to the row, written with its mark (a note, a teardown's state).
    again: the command that tries once more, for a lookup by label that cannot be asked.
    """

    label: str
    box_id: str | None = None
    seen_id: str | None = None
    judged: bool = False
    force: bool = False
    also: Mapping[str, Any] = field(default_factory=dict)
    again: str = ""


# the disruption budget: given the row, False when it is spent (the caller said why, box kept)
Spend = Callable[[Row], bool]


@dataclass
class Destroyed:
    label: str
    box_ids: list[str]
    row: Row | None  # the row as marked; None for an orphan (its row is not its box's)


def destroy(cfg: Config, reg: Registry, providers: Mapping[str, Provider], order: Order, *,
            spend: Spend | None = None) -> Destroyed | None:
    """Destroy one box through every guard, in order (the module's docstring). None when the
    disruption budget kept it (`spend` said why)."""
    row = guard(cfg, reg, providers, order)
    if order.box_id is None:
        row = _reread(reg, order)
    if spend is not None and not spend(row):
        return None
    p = lifecycle.provider_for(dict(providers), row.provider, f"cannot destroy {row.label}")
    reg.check_fence()  # a loop that lost the lead destroys nothing (`fleet.state.leader`)
    if order.box_id is not None:
        _gone(p, order.box_id)
        return Destroyed(row.label, [order.box_id], None)
    if row.provider_id:
        _gone(p, row.provider_id)
        ids = [row.provider_id]
    else:  # a rent stopped before it learnt its box's id: every box under its label
        ids = lifecycle.destroy_by_label(p, reg, row.label,
                                         order.again or f"fleet destroy {row.label}")
    marked = _mark(reg, row.label, ids, order)
    # its master connection goes with it (known_hosts, rewritten later, would close it too)
    sshmux.close_endpoint(str(cfg.known_hosts), row.ssh_host, row.ssh_port, row.host_key)
    return Destroyed(row.label, ids, marked)


def mark_gone(reg: Registry, providers: Mapping[str, Provider], label: str, *,
              force: bool = False) -> Row:
    """Mark the live row `label` vanished on an operator's word that its box is gone at its
    provider (checked in the console), without a destroy: for a box the fleet's key cannot
    see. Refused while the key still shows a box by the row's id or under its label (it is
    then destroyed, not marked), for a rent that has no box id yet (its create may still
    land), and for unread one-shot outputs without `force` (they are lost with the box). A
    provider that cannot be asked refuses too: nothing is marked blind. A box listed running
    again under the row's id is the loop's to judge like any vanished box: taken back while
    its place is not yet filled by a converted replacement, else an orphan, swept within the
    disruption budget."""
    row = reg.get(label)
    if row is None:
        raise Refused(f"no box labelled {label!r} in the registry")
    if not row.live:
        raise Refused(f"{label} is already {row.status}")
    if unfinished(row) and not row.provider_id:
        raise Refused(f"{label} is a rent not finished ({row.status}, no box id yet): its "
                      "create may still land, and its box would bill with no row to own it; "
                      "the loop gives it up at its deadline, or `fleet destroy "
                      f"{label}` looks it up by its label")
    if unread(row) and not force:
        raise Refused(f"{label} holds job {row.job}, whose outputs were not read back: if its "
                      "box is gone they are lost (add --force to mark it gone anyway)")
    p = lifecycle.provider_for(dict(providers), row.provider, f"cannot mark {label} gone")
    shown = p.box(row.provider_id) if row.provider_id else None
    shown = shown or p.find_by_label(label)
    if shown is not None:
        raise Refused(f"{row.provider} shows box {shown.box_id} ({shown.status}) for {label} "
                      f"to this key: not gone; `fleet destroy {label}` destroys it")
    ids = [row.provider_id] if row.provider_id else []
    return _mark(reg, label, ids, Order(label, also={
        "note": f"marked gone by the operator: {row.provider}'s console shows no box "
                f"{row.provider_id or 'under its label'} (the fleet's key could not see it)"}),
                 status=BoxStatus.VANISHED)


def _mark(reg: Registry, label: str, ids: list[str], order: Order,
          status: BoxStatus = BoxStatus.DESTROYED) -> Row:
    """Mark the row destroyed, in one locked step with the check that it still names a box
    just destroyed (or none): a row rented again meanwhile (its rent resumed by an operator)
    stays live, its new box counted and kept."""
    with reg.transaction() as rows:
        row = rows.get(label)
        if row is None or not row.live or (row.provider_id is not None
                                           and row.provider_id not in ids):
            now = "gone" if row is None else f"{row.status}, box {row.provider_id}"
            raise Refused(f"{label} changed while box {', '.join(ids) or 'none'} was destroyed "
                          f"(now {now}): its row is left as it is")
        row.status, row.destroyed_at = status, now_iso()
        for k, v in order.also.items():
            setattr(row, k, v)
        return row


def guard(cfg: Config, reg: Registry, providers: Mapping[str, Provider], order: Order) -> Row:
    """The row that owns the box `order` names, through the guards that change nothing
    (steps 1 to 3): what a dry run shows, or the refusal a destroy would meet."""
    row = _owned(cfg, reg, providers, order)
    if order.box_id is None:
        if is_standing(cfg, row) and not (order.judged or order.force):
            raise Refused(f"{row.label} is a box of the standing role {row.role}; standing "
                          "boxes are replaced, not destroyed (use --force to destroy it anyway)")
        if not row.provider_id and not order.force and not fleet_form(cfg, reg).match(row.label):
            raise Refused(f"{row.label} has no box id recorded and its label is not of this "
                          "fleet's form: a box under it may be a person's (use --force to "
                          "destroy whatever carries the label)")
        if unread(row) and not order.force:
            raise Refused(f"{row.label} holds job {row.job}, whose outputs were not read back: "
                          f"run `fleet teardown {row.label}` (or --force to lose them)")
    return row


def _owned(cfg: Config, reg: Registry, providers: Mapping[str, Provider],
           order: Order) -> Row:
    """The row that owns the box `order` names (ownership, step 1)."""
    row = reg.get(order.label)
    if row is None:
        raise Refused(f"no box labelled {order.label!r} in the registry")
    if order.box_id is None:
        if not row.live:
            raise Refused(f"{order.label} is already {row.status}")
        return row
    if row.live and row.provider_id in (None, order.box_id):
        # its own, or a rent under the label has not learnt its box's id yet: it may be this
        # (a row given up or vanished holds no box: one listed under it is an orphan)
        raise Refused(f"box {order.box_id} is, or may be, {order.label}'s own: not destroyed as "
                      "another box under its label")
    if not fleet_form(cfg, reg).match(order.label):
        raise Refused(f"{order.label} is not of this fleet's label form: box {order.box_id} "
                      "under it may be a person's or another fleet's, and is never destroyed")
    p = lifecycle.provider_for(dict(providers), row.provider, f"cannot destroy {order.label}")
    box = p.box(order.box_id)
    if box is None or box.label != order.label:
        under = "not listed" if box is None else f"listed under {box.label!r}"
        raise Refused(f"box {order.box_id} is {under} at {row.provider}, not under "
                      f"{order.label}: not destroyed")
    return row


def fleet_form(cfg: Config, reg: Registry) -> re.Pattern[str]:
    """The exact form of the labels this fleet makes (`fleet.core.labels`): its roles in
    fleet.toml, its fleet id in the registry."""
    return labels.fleet_form(tuple(cfg.roles), reg.fleet_id())


def _reread(reg: Registry, order: Order) -> Row:
    """The row again, under the registry's lock, just before the destroy (step 4)."""
    row = reg.get(order.label)
    if row is None or not row.live:
        raise Refused(f"{order.label} changed since it was judged (now "
                      f"{'gone from the registry' if row is None else row.status}): kept")
    if order.seen_id is not None and row.provider_id != order.seen_id:
        raise Refused(f"{order.label} changed since it was judged (its box is now "
                      f"{row.provider_id}, not {order.seen_id}): kept")
    return row


def _gone(p: Provider, box_id: str) -> None:
    """Destroy box `box_id` and confirm its provider no longer has it."""
    p.destroy(box_id)
    if p.box(box_id) is not None:
        raise ProviderError(p.name, "destroy", f"box {box_id} is still listed",
                            "it may still bill; it is destroyed again on the next try")
