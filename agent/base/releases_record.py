"""The previous-release record (`standing.node.previous`), written at every pointer change a
switch makes: the release it moved away from, and where it led. A storage clean keeps the
`previous` one while the pointer still names `to` (agent/space.py); a record that does not
match the pointer, or none at all, keeps every release."""

from __future__ import annotations

import json

from agent.base.files import atomic_write
from agent.contract import POINTER_PREVIOUS, Layout


def record(layout: Layout, previous: dict[str, str], to: dict[str, str]) -> None:
    """Record a move of the pointer from `previous` to `to` (each {"target", "sha256"}),
    before the pointer is written. A record that cannot be written is removed, so that no
    older one names a wrong release (the clean then keeps every release); neither failure
    stops a switch."""
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
