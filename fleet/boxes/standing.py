"""Registry side of the standing deploy."""

from __future__ import annotations

from fleet.boxes.deploy_support import config
from fleet.core.times import now_iso
from fleet.state.registry import Registry


def mark_standing(label: str, role: str, node_sha16: str) -> None:
    """Mark the row standing (standing_since set once, never moved) with its wanted node."""
    reg = Registry(config().registry)
    row = reg.get(label)
    if row is None or row.standing:
        return
    reg.update(label, standing=True, standing_since=now_iso(), role=role,
               node_sha16_wanted=node_sha16)
