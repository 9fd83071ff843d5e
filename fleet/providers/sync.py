"""Match what the providers list against the registry.

Live boxes are keyed by label, and by id where the row knows its box's id. A box a provider
lists whose label the registry lacks (or whose row is no longer live) is an *orphan*: never
deployed to, always reported (it may be billing). A second box under a live row's label is
an orphan too (a *duplicate*): it bills, and the checks must never judge it for the row's.

A registry row whose box the listing leaves out is *unlisted*, and *gone* once the provider,
asked for that box's id, says it has no such box: a listing that answers 200 but leaves a box
out is the fleet's blindness, not the box's death. Gone is never a death alone: the loop also
probes the box's SSH where it last was, and counts every unlisted box towards its provider's
breaker (`fleet.ops.loop`). When the question by id fails too, the row is *unsure*: not judged
this tick.

A listing row the client cannot read (`Unreadable`) is neither a box nor an orphan: every
live row it may be (same id, or same label where the id is unknown) is unsure, and the rest of
the listing is read as usual.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleet.core.errors import ProviderError
from fleet.providers.base import Box, Provider, Unreadable, oldest_first

if TYPE_CHECKING:
    from fleet.core.boxes import Row
    from fleet.state.registry import Registry


@dataclass
class View:
    matched: list[tuple[Row, Box]] = field(default_factory=list)
    orphans: list[Box] = field(default_factory=list)  # duplicates among them
    gone: list[Row] = field(default_factory=list)  # live in the registry, by id said gone
    unlisted: set[str] = field(default_factory=set)  # labels of live rows the listing left out
    failures: list[ProviderError] = field(default_factory=list)
    # "provider/id" of the orphans that carry a live row's label beside the row's own box
    duplicates: set[str] = field(default_factory=set)
    unsure: dict[str, str] = field(default_factory=dict)  # label -> why it cannot be told
    unreadable: list[Unreadable] = field(default_factory=list)  # listing rows not understood


def view(reg: Registry, providers: Mapping[str, Provider]) -> View:
    rows = {r.label: r for r in reg.rows()}
    out = View()
    for name, p in providers.items():
        try:
            boxes = p.boxes()
        except ProviderError as e:
            out.failures.append(e)
            continue
        odd = [b for b in boxes if isinstance(b, Unreadable)]
        out.unreadable.extend(odd)
        _match(out, name, rows, [b for b in boxes if isinstance(b, Box)])
        _left_out(out, p, name, rows, _MayBe(odd))
    return out


def _match(out: View, name: str, rows: Mapping[str, Row], boxes: list[Box]) -> None:
    """Provider `name`'s listed boxes against the rows, by label: each live row's own box
    (by its id; the oldest where its rent never learnt one) matched, every other an orphan
    (a second one under a live row's label a duplicate too)."""
    by_label: dict[str, list[Box]] = {}
    for b in boxes:
        by_label.setdefault(b.label, []).append(b)
    for label, found in by_label.items():
        row = rows.get(label)
        if row is None or row.provider != name or not row.live:
            out.orphans.extend(found)
            continue
        found.sort(key=oldest_first)
        own = next((b for b in found if b.box_id == row.provider_id), None)
        if own is None and row.provider_id is None:
            own = found[0]  # an unfinished rent's box: the oldest, as the rent keeps
        if own is not None:
            out.matched.append((row, own))
        for b in found:
            if b is not own:
                out.orphans.append(b)
                out.duplicates.add(f"{name}/{b.box_id}")


def _left_out(out: View, p: Provider, name: str, rows: Mapping[str, Row],
              may_be: _MayBe) -> None:
    """Provider `name`'s live rows its listing left out: unsure where an unreadable listing
    row may be their box, else asked for by id (`_confirm`)."""
    seen = {row.label for row, _ in out.matched}
    for r in rows.values():
        if not r.live or r.provider != name or r.label in seen:
            continue
        maybe = may_be(r)
        if maybe is not None:
            out.unsure[r.label] = str(maybe)
        elif r.provider_id:
            _confirm(out, p, r)


class _MayBe:
    """The first unreadable listing row (in the listing's order) that may be a row's box: the
    same id where both ids are known, else the same label or none. Indexed once, so a listing
    of many unreadable rows is not scanned again for each registry row."""

    def __init__(self, odd: list[Unreadable]) -> None:
        self.odd = odd
        self.by_id: dict[str, int] = {}  # box id -> first row with it
        self.by_label: dict[str | None, int] = {}  # label (None: none) -> first row
        self.by_label_no_id: dict[str | None, int] = {}  # the same, of the rows without an id
        for i, u in enumerate(odd):
            if u.box_id is not None:
                self.by_id.setdefault(u.box_id, i)
            else:
                self.by_label_no_id.setdefault(u.label, i)
            self.by_label.setdefault(u.label, i)

    def __call__(self, row: Row) -> Unreadable | None:
        if row.provider_id is not None:  # by id, or by label (or none) where its id is unknown
            found = [self.by_id.get(row.provider_id), self.by_label_no_id.get(row.label),
                     self.by_label_no_id.get(None)]
        else:
            found = [self.by_label.get(row.label), self.by_label.get(None)]
        first = min((i for i in found if i is not None), default=None)
        return None if first is None else self.odd[first]


def _confirm(out: View, p: Provider, row: Row) -> None:
    """A live row the listing left out: ask the provider for its box by id."""
    assert row.provider_id is not None
    out.unlisted.add(row.label)
    try:
        box = p.box(row.provider_id)
    except ProviderError as e:
        out.unsure[row.label] = (f"{row.provider}'s listing left out box {row.provider_id} "
                                 f"and asking for it failed ({e})")
        return
    if box is None:
        out.gone.append(row)
    else:
        out.matched.append((row, box))  # the listing's blind spot, not the box's death
