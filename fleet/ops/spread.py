"""Standing boxes of one role spread across places, so one host failure takes one box.

A place is what a provider names of where a box runs (`fleet.providers.base.place_of`): a
Vast machine, a RunPod Secure Cloud data center. RunPod lets no offer choose a machine, so its
boxes spread by data center where offers name one; a Community Cloud offer names none, and a
box rented there is noted as placed where the spread cannot see.

The rule, for a standing role whose `spread` is on (fleet.toml, default true): offers on a
place none of the role's live boxes holds come first, cheapest first; then offers that name no
place (nothing says they are shared, nothing that they are apart); then offers on places
already held, the least crowded first. A box rented on a held place because nothing else was
offered gets a row note that says why, and the loop moves it later (`Loop._start_moves`) once
an offer on a free place appears: the new box is rented within the budget and the crowded one
is destroyed only once the new one is checked well and synced (`Loop._finish_moves`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from fleet.core.boxes import Row
from fleet.core.states import BoxKind

if TYPE_CHECKING:
    from fleet.core.config import Role
    from fleet.providers.base import Offer


def holders(rows: Iterable[Row], role: str, but: str | None = None) -> dict[str, list[str]]:
    """place -> the labels of `role`'s live boxes there, oldest first (`but` left out: the box
    a rent replaces). Boxes whose place is not named are not counted."""
    held: dict[str, list[str]] = {}
    live = sorted((r for r in rows if r.live and r.role == role and r.place
                   and not r.destroy_wanted and r.label != but), key=lambda r: r.created_at)
    for r in live:
        assert r.place is not None
        held.setdefault(r.place, []).append(r.label)
    return held


def order(role: Role, offers: Sequence[Offer], held: dict[str, list[str]]) -> list[Offer]:
    """`offers` (cheapest first) in the order a rent tries them: unchanged where the role does
    not spread, else free places first, then offers that name no place, then held places,
    least crowded first (stable: cheapest first within each)."""
    if role.kind != BoxKind.STANDING or not role.spread:
        return list(offers)

    def rank(o: Offer) -> tuple[int, int]:
        if o.place is None:
            return 1, 0  # nothing says it is shared, nothing says it is apart
        crowd = len(held.get(o.place, []))
        return (0, 0) if not crowd else (2, crowd)
    return sorted(offers, key=rank)


def note(role: Role, offer: Offer, held: dict[str, list[str]],
         tried: Sequence[Offer]) -> str | None:
    """What the row of a box rented from `offer` says of its place: why it shares one, or
    that the provider names none; None where the spread holds (or is off)."""
    if role.kind != BoxKind.STANDING or not role.spread:
        return None
    if offer.place is None:
        return (f"placed where the spread cannot see: {offer.provider} names no machine or "
                f"data center for this offer ({offer.cloud or 'no tier'})")
    others = held.get(offer.place)
    if not others:
        return None
    free = [o for o in tried if o.place is None or o.place not in held]
    why = ("every offer was on a place the role already holds" if not free else
           f"the {len(free)} offers on other places were refused or gone")
    return f"shares {offer.place} with {', '.join(others)}: {why}"


def crowded(rows: Iterable[Row], role: Role) -> list[Row]:
    """The role's live boxes that share a place with an older one (the oldest stays), oldest
    first: the ones the loop moves. None where the role does not spread."""
    if role.kind != BoxKind.STANDING or not role.spread:
        return []
    rows = list(rows)
    by_label = {r.label: r for r in rows}
    out = [by_label[label] for labels in holders(rows, role.name).values()
           for label in labels[1:]]
    return sorted(out, key=lambda r: r.created_at)


def free_offers(offers: Iterable[Offer], held: dict[str, list[str]]) -> list[Offer]:
    """The offers on a named place the role does not hold: where a crowded box may move."""
    return [o for o in offers if o.place is not None and o.place not in held]


def short(place: str) -> str:
    """A place as a table cell beside its provider's column: `10697`, `EU-RO-1`."""
    return place.split(" ", 1)[1].removeprefix("machine ").removeprefix("data center ")


def per_place(rows: Iterable[Row]) -> dict[str, int]:
    """How many live boxes each named place holds (the roster's and the page's count)."""
    counts: dict[str, int] = {}
    for r in rows:
        if r.live and r.place:
            counts[r.place] = counts.get(r.place, 0) + 1
    return dict(sorted(counts.items()))  # the same rows give the same bytes
