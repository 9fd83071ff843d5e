"""The previous-release record (`standing.node.previous`), written at every pointer change a
switch makes: the release it moved away from, and where it led. A storage clean keeps the
`previous` one while the pointer still names `to` (agent/space.py); a record that does not
match the pointer, or none at all, keeps every release. The same move ends the staging of both
releases (`releases.staged/<name>`, written by a publish): the pointer has named each."""

from __future__ import annotations

import json
import os

from agent.base.files import atomic_write
from agent.contract import POINTER_PREVIOUS, RELEASES_STAGED, Layout, PointerDoc
from agent.space import Unresolved, release_names


def record(layout: Layout, previous: PointerDoc, to: PointerDoc) -> None:
    """Record a move of the pointer from `previous` to `to` (each {"target", "sha256"}),
    before the pointer is written, and then remove the staging records of both. A record that
    cannot be written is removed, so that no older one names a wrong release (the clean then
    keeps every release), and the staging records stay; neither failure stops a switch."""
    path = layout.root / POINTER_PREVIOUS
    text = json.dumps({"previous": previous["target"], "previous_sha256": previous["sha256"],
                       "to": to["target"], "to_sha256": to["sha256"]})
    try:
        atomic_write(path, text + "\n", durable=True)
    except OSError:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
        return
    unstage(layout, previous["target"], to["target"])


def unstage(layout: Layout, *targets: str) -> None:
    """Remove the staging record of each release a target lies in (one that leads to no
    single release removes nothing: its staging keeps it)."""
    for target in targets:
        try:
            names = release_names(target, layout.root)
        except Unresolved:
            continue
        for name in names:
            try:
                os.unlink(layout.root / RELEASES_STAGED / name)
            except OSError:
                pass
