"""Match what the providers list against the registry.

Live boxes are keyed by label. A box a provider lists whose label the registry lacks is an
*orphan*: never deployed to, always reported (it may be billing). A registry row whose box no
provider lists any more is *gone*.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet.errors import ProviderError
from fleet.providers.base import Box, Provider
from fleet.registry import Registry, Row


@dataclass
class View:
    matched: list[tuple[Row, Box]] = field(default_factory=list)
    orphans: list[Box] = field(default_factory=list)
    gone: list[Row] = field(default_factory=list)  # live in the registry, listed by no provider
    failures: list[ProviderError] = field(default_factory=list)


def view(reg: Registry, providers: Mapping[str, Provider]) -> View:
    rows = {r.label: r for r in reg.rows()}
    out = View()
    listed: set[str] = set()
    reached: set[str] = set()
    for name, p in providers.items():
        try:
            boxes = p.boxes()
        except ProviderError as e:
            out.failures.append(e)
            continue
        reached.add(name)
        for b in boxes:
            row = rows.get(b.label)
            if row is None or row.provider != name or row.destroyed_at is not None:
                out.orphans.append(b)
                continue
            listed.add(b.label)
            out.matched.append((row, b))
    for r in rows.values():
        if r.live and r.provider in reached and r.label not in listed and r.status != "renting":
            out.gone.append(r)
    return out
