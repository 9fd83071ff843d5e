"""Renting a box: budget first, a registry row before the provider call, one box per label.

The row is written (status `renting`) before the provider is asked, so a crash between the
provider's answer and our bookkeeping leaves a label the fleet can look up instead of an
unknown box that bills. The provider clients make the call itself idempotent per label.
The budget check and the row are one locked step (`Registry.add(check=budget.guard(...))`);
the account's listing it counts (every box on it, the registry's or not) is read before.
Once the box exists, the price its provider lists for it is checked again the same way when it
is higher than the offer's: a box that no longer fits is destroyed.

A create whose outcome is unknown (a timeout, a 5xx, an interrupt, `RentOutcomeUnknown`) and
whose box no lookup finds leaves its row unfinished (`renting`) and stops the rent: no other
offer is tried under a new label while a box may exist under this one. Only a create the
provider refused (an offer gone, no capacity, an HTTP 4xx) marks its row `failed`.

A rent that stopped half-way (its row `unfinished`) is resumed by renting its label again:
`find_unfinished` looks the box up at the row's provider; one found is recorded, none found
is rented under the same label (`rent(..., resume=True)`), its row replaced.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.contract import HOST_KEYS, ROOT, SSH_DIR
from fleet.boxes import lifecycle
from fleet.boxes.sshkeys import ensure_key, public_key, write_known_hosts
from fleet.core.boxes import Row
from fleet.core.errors import (
    BudgetExceeded,
    FleetError,
    NoCapacity,
    OfferGone,
    ProviderError,
    UsageError,
)
from fleet.core.labels import fleet_id_of, new_label
from fleet.core.states import BoxStatus
from fleet.core.times import in_hours, now_iso
from fleet.ops import budget, destroy, ports, spread
from fleet.ops import offers as offers_mod
from fleet.providers.base import Box, Offer, Provider, RentRequest, Unreadable
from fleet.state import bills

if TYPE_CHECKING:
    from fleet.core.config import Config, Role
    from fleet.state.registry import Registry

# The start hook, run at every container start: the fleet's boot script, once a deploy has
# written it. Vast runs the instance's onstart. RunPod runs the pod's dockerArgs in place of
# the image's command, so it starts the boot script beside the image's /start.sh (which starts
# sshd), in dstack's JSON form. A hook written on RunPod's container disk (/post_start.sh)
# would be gone after the first restart: dockerArgs stays with the pod.
BOOT = f"[ -x {ROOT}/boot.sh ] && {ROOT}/boot.sh"
# RunPod's container disk is new at every restart, and its image's /start.sh makes new SSH host
# keys where /etc/ssh has none: the keys the standing deploy kept on the volume are put back
# first, before /start.sh looks (`operations.box.host_keys_kept`). A pod with none kept (before
# its first deploy) starts as it would without this. Vast keeps its disk, and /etc/ssh on it.
_KEPT = f"{ROOT}/{HOST_KEYS}"
RESTORE_KEYS = (f"[ -f {_KEPT}/ssh_host_ed25519_key ] && "
                f"cp -p {_KEPT}/ssh_host_* {SSH_DIR}/")
ONSTART = {
    "vast": f"{BOOT}; exit 0",
    "runpod": json.dumps({"entrypoint": ["/bin/sh", "-c"],
                          "cmd": [f"{RESTORE_KEYS}; {BOOT} & exec /start.sh"]}),
}


def other_fleets(reg: Registry, providers: Mapping[str, Provider]) -> None:
    """Refuse to rent for a registry that holds no live row (empty, or a fleet torn down)
    while the account lists boxes another fleet made (labels of the fleet form with another
    fleet id): most likely the registry's path is wrong, and renting would put a second
    roster beside the running fleet. UsageError, one line naming them; the operator starts a
    new fleet beside them with `--new-fleet`, which skips this check (the budget still counts
    their boxes). A listing that fails refuses too: whether the account holds another fleet
    cannot be told."""
    rows = reg.rows()
    if any(r.live for r in rows):
        return
    listings: dict[str, Sequence[Box | Unreadable]] = {}
    for name, p in providers.items():
        try:
            listed = p.boxes()
        except ProviderError as e:
            raise FleetError(f"the registry {reg.path} holds no live box and {name}'s listing "
                             f"failed, "
                             f"so whether the account holds another fleet's boxes cannot be "
                             f"told ({e}); nothing rented (--new-fleet to start a new fleet "
                             f"anyway)") from None
        listings[name] = listed
    # read after the listings: a box of this fleet (another `fleet rent` of it at the same
    # moment) had its fleet id written before it was rented, so it is never taken for another's
    own = reg.stored_fleet_id()
    theirs: dict[str, str] = {}  # what names each box -> its fleet id
    for name, listed in listings.items():
        for b in listed:
            fid = fleet_id_of(b.label or "")
            if fid is not None and fid != own:
                theirs[f"{b.label} ({name}/{b.box_id or '?'})"] = fid
    if theirs:
        shown = ", ".join(sorted(theirs)[:10]) + \
            (f" and {len(theirs) - 10} more" if len(theirs) > 10 else "")
        raise UsageError(f"the registry {reg.path} holds no live box, but the account lists "
                         f"{len(theirs)} of another fleet (fleet id "
                         f"{', '.join(sorted(set(theirs.values())))}): {shown}; is the "
                         f"registry's path right? Nothing rented; --new-fleet starts a new "
                         f"fleet beside them")


def request_for(cfg: Config, role: Role, label: str, provider: str) -> RentRequest:
    key = public_key(ensure_key(cfg.ssh_key))
    # RunPod drops the container disk at every stop and restart and keeps the pod's volume
    # (shared/research/providers.md, "Disks"): the fleet's root (agent, releases, the node's
    # data, outputs) is the volume, so a restarted pod comes back without resyncing its node.
    # Vast keeps its one disk. The offers were searched for the same (`offers.search`).
    disk, volume = offers_mod.disks(role, provider)
    return RentRequest(
        label=label, image=role.image, disk_gb=disk, tcp_ports=role.tcp_ports,
        env={"PUBLIC_KEY": key}, onstart=ONSTART.get(provider), allowed_cuda=role.allowed_cuda,
        volume_gb=volume, volume_path=ROOT if volume else None,
    )


@dataclass
class RentOutcome:
    row: Row
    box: Box | None


def rent(cfg: Config, reg: Registry, role: Role, offers: Sequence[Offer],
         providers: dict[str, Provider], label: str | None = None,
         rerent_of: str | None = None, resume: bool = False,
         job: tuple[str, int] | None = None, move_of: str | None = None,
         move_for: str | None = None,
         account: budget.Listing | None = None, slot: str | None = None) -> RentOutcome:
    """Rent the cheapest offer that still has capacity; refuse if the budget would break.

    + label: the box's label (default: generated); after an offer that went, the next one
      gets a generated label (the first one's row is kept, `failed`)
    + rerent_of: the label of the box this one replaces
    + slot: the roster slot it fills (`fleet.ops.owed`): refused when a live box holds it
    + move_of: the label of the live box this one takes over from (the loop's move of a box
      that shares its place, `fleet.ops.spread`, or of one owed a port, `fleet.ops.ports`)
    + move_for: why it moves: "place" or "port"
    + resume: `label` holds an unfinished rent's row whose box the provider does not list
      (see `find_unfinished`): the new row replaces it, and its budget check counts the old
      row's cost until now but not beside the new box
    + job: a one-shot job's (name, TTL minutes): the budget counts the box for its TTL only
      (or until midnight, if sooner) and the row records the job and its deadline
    + account: every box `providers` list (`budget.listed`), read this tick; default: read
      now. The budget counts the ones no row owns; a listing that fails refuses the rent

    Raises BudgetExceeded before renting, or after when the price the provider lists for the
    box is over the budget (the box is destroyed, its row says so); a ProviderError of a
    create whose outcome is unknown (see the module docstring) leaves the row unfinished.
    """
    if not offers:
        raise NoCapacity("fleet", "offers", f"no admissible offer for role {role.name!r}",
                         "try another card or provider, or later")
    last: ProviderError | None = None
    over: BudgetExceeded | None = None
    # a standing role's boxes go to places it does not hold yet, where any is offered
    held = spread.holders(reg.rows(), role.name, but=label if resume else None)
    offers = spread.order(role, offers, held)[:5]
    if account is None:
        account = budget.listed(providers, f"renting for role {role.name!r}")
    if label is not None and not resume:
        _label_free(label, account)
    for offer in offers:
        p = providers[offer.provider]
        lab = label or new_label(role.name, offer.provider, reg.fleet_id())
        # every candidate is checked: a later one may cost more than the first; the check
        # and the row are one locked step, so concurrent rents cannot both pass it
        what = f"renting a {offer.card} on {offer.provider} for ${offer.usd_per_hour:.3f}/h"
        hours = None if job is None else job[1] / 60
        req = request_for(cfg, role, lab, offer.provider)
        try:
            row = _add_row(cfg, reg, role, offer, req, lab, what, hours, rerent_of,
                           (move_of, move_for), resume, job, held, offers, account, slot)
        except BudgetExceeded as e:
            # no row was written; the spread's order is not the price's, so a cheaper offer
            # further on may still fit
            over = over or e
            continue
        # the lead lost since the row was written: no create (the new leader finds the row
        # unfinished, and no box under its label); the window left is this call's own
        reg.check_fence()
        try:
            box = p.rent(offer, req)
        except BaseException as e:
            if isinstance(e, NoCapacity | OfferGone) and _refused(e):
                # the offer went between search and rent: the next one may still be there
                reg.update(lab, status=BoxStatus.FAILED, destroyed_at=now_iso(), note=str(e))
                last, label, resume = e, None, False
                continue
            # whatever happened, a box carrying our label may exist: record it, never leak it
            found = lifecycle.lookup(p, lab)
            if found is None:
                if _refused(e):
                    reg.update(lab, status=BoxStatus.FAILED, destroyed_at=now_iso(),
                               note=str(e)[:300])
                else:
                    # a box may exist that no lookup sees yet: the row stays unfinished, its
                    # label looked up again (`find_unfinished`); nothing else is rented
                    reg.update(lab, note=_unknown_note(e))
                raise
            box = found
        lifecycle.record(reg, lab, box)
        row = check_listed(cfg, reg, p, offer, lab, box.box_id, account, hours)
        return RentOutcome(row, box)
    if over is not None and last is None:
        raise over
    assert last is not None
    raise last


def _label_free(label: str, account: budget.Listing) -> None:
    """Refuse (one line, nothing written) a new rent under a label some box on the account
    already carries: every rent writes its row first, so that box is not this fleet's (a
    person's, another registry's), and the provider's client would take it for the rent's
    own box (a label is the create's idempotency key) and destroy the others under it."""
    taken = [b for b in account if b.label == label]
    if taken:
        where = ", ".join(f"{b.provider} {b.box_id}" for b in taken)
        raise UsageError(f"label {label!r} is carried by a box this fleet never rented ({where}): "
                         "nothing rented; pick another label")


def _add_row(cfg: Config, reg: Registry, role: Role, offer: Offer, req: RentRequest, lab: str,
             what: str, hours: float | None, rerent_of: str | None,
             move: tuple[str | None, str | None], resume: bool,
             job: tuple[str, int] | None, held: dict[str, list[str]],
             offers: Sequence[Offer], account: budget.Listing, slot: str | None) -> Row:
    """The rent's row, written under the registry's lock with the budget's check: raises
    BudgetExceeded (nothing written) when the offer does not fit."""
    return reg.add(Row(
        label=lab, provider=offer.provider, role=role.name, kind=role.kind, card=offer.card,
        gpu_count=offer.gpu_count, usd_per_hour=offer.usd_per_hour, driver=offer.driver,
        cloud=offer.cloud, stopped_usd_per_hour=offer.stopped_usd_per_hour(req),
        rerent_of=rerent_of, slot=slot, move_of=move[0], move_for=move[1] if move[0] else None,
        node_sha16_wanted=None, place=offer.place, note="; ".join(filter(None, (
            "resumed after an unfinished rent" if resume else None,
            ports.rent_note(role, offer), spread.note(role, offer, held, offers)))) or None,
        job=None if job is None else job[0],
        expires_at=None if hours is None else in_hours(hours)),
        check=budget.guard(cfg.daily_budget_usd, offer.usd_per_hour, what,
                           replacing=lab if resume else None, new_hours=hours,
                           bills=bills.load(cfg.registry), account=account),
        resume=resume)


def _refused(e: BaseException) -> bool:
    """Whether `e` says the create took no effect: the provider refused it (an offer gone, no
    capacity, an HTTP 4xx answer) or it was never sent (the operator's mistake). Anything
    else (a timeout, a 5xx, an unreadable answer, an interrupt, a bug) may have left a box."""
    return isinstance(e, UsageError) or (isinstance(e, ProviderError) and e.refused)


def _unknown_note(e: BaseException) -> str:
    why = str(e) or type(e).__name__
    return (f"rent outcome unknown, a box may exist under this label: it will be looked up "
            f"again by label ({why})")[:300]


def check_listed(cfg: Config, reg: Registry, p: Provider, offer: Offer, label: str,
                 box_id: str, account: budget.Listing, hours: float | None = None) -> Row:
    """Record the price `p` lists for the box rented under `label` and, where it is higher than
    the offer's (Vast's listing counts the disk the box got, RunPod's the pod it placed), check
    the budget again at it, under the registry's lock (as `budget.guard` does for a rent; the
    row counts its cost until now, the box the listed price from now, `hours` as the rent's,
    `account` the boxes listed before the rent).
    A box that no longer fits is destroyed, its row marked so with why, and BudgetExceeded is
    raised. A listing that fails, or shows no price, keeps the offer's price."""
    try:
        listed = p.box(box_id)
    except ProviderError:
        listed = None
    row = reg.get(label)
    assert row is not None
    if listed is None or listed.usd_per_hour <= 0:
        return row
    price = listed.usd_per_hour
    if price <= offer.usd_per_hour + 1e-9:
        return reg.update(label, usd_per_hour=price)
    what = (f"keeping {label} ({offer.card} on {offer.provider}) at its listed "
            f"${price:.3f}/h, offered at ${offer.usd_per_hour:.3f}/h,")
    check = budget.guard(cfg.daily_budget_usd, price, what, replacing=label, new_hours=hours,
                         bills=bills.load(cfg.registry), account=account)
    over: BudgetExceeded | None = None
    with reg.transaction() as rows:
        try:
            check(list(rows.values()))
        except BudgetExceeded as e:
            over = e
        row = rows[label]
        row.usd_per_hour = price
    if over is None:
        return row
    why = f"over budget at the listed price ${price:.3f}/h (offered at ${offer.usd_per_hour:.3f}/h)"
    try:  # the rent's own box, never converted: its undo waives the standing guard
        destroy.destroy(cfg, reg, {p.name: p}, destroy.Order(
            label, seen_id=box_id, force=True, also={"note": f"{why}: destroyed"}))
    except ProviderError as e:
        # still live, so the budget counts it; never resumed, converted or counted as
        # filling the roster: the loop destroys it (`Loop._destroy_wanted`)
        reg.update(label, destroy_wanted=why,
                   note=f"{why}; destroying it failed, it may still bill: {e}"[:300])
        raise
    err = BudgetExceeded(f"{over}; box {box_id} was destroyed")
    raise err from None




def wait_ready(cfg: Config, reg: Registry, providers: dict[str, Provider], labels: list[str],
               timeout_s: float = 180.0, poll_s: float = 0.5,
               progress: Callable[[str, str], None] | None = None) -> dict[str, Row]:
    """Poll until every label's box is running with SSH up, pin its host key, return rows.

    A box its provider reports exited (its container failed to start, or stopped on its own)
    is not waited for: the others are, then the error names it in the provider's words."""
    pending = set(labels)
    done: dict[str, Row] = {}
    exited: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while pending:
        for label in sorted(pending):
            row = reg.get(label)
            if row is None or row.provider_id is None:
                raise FleetError(f"{label}: no provider id recorded")
            box = providers[row.provider].box(row.provider_id)
            if box is None:
                raise FleetError(f"{label}: {row.provider} no longer lists box {row.provider_id}")
            row = lifecycle.record(reg, label, box)
            # a spot bid waiting for capacity is "stopped", not this
            if box.status == BoxStatus.EXITED:
                said = " | ".join((box.status_note or "no reason given").split("\n"))
                exited[label] = (f"{label}: {row.provider} reports box {row.provider_id} exited "
                                 f"before SSH answered: {said}")
                pending.discard(label)
                continue
            key = lifecycle.host_key_if_ready(box)
            if key is None:
                continue
            done[label] = lifecycle.pin(reg, row, key)
            pending.discard(label)
            if progress:
                progress(label, "ready")
        if pending:
            if time.monotonic() > deadline:
                late = ", ".join(sorted(pending))
                raise FleetError("; ".join([f"not SSH-ready after {timeout_s:.0f}s: {late}",
                                            *(exited[label] for label in sorted(exited))]))
            time.sleep(poll_s)
    write_known_hosts(cfg.known_hosts, reg.rows())
    if exited:
        raise FleetError("; ".join(exited[label] for label in sorted(exited)))
    return done
