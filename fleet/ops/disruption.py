"""The disruption budget: how many of a role's standing boxes the loop may destroy on its own
judgement (dead by SSH, unfit, swept, moved) within a window, so that a misjudgement the
breakers miss costs at most that many boxes an hour, never the fleet (Kubernetes'
PodDisruptionBudget, with the rate limit of its node lifecycle controller's evictions).

A role may lose max(1, `[loop] disruption_fraction` of its wanted boxes) in any
`[loop] disruption_window_s`. A box its provider itself reports exited, stopped or gone is
destroyed or marked without waiting (nothing alive is lost), and counts all the same. The
records live in the loop's memory (`Memory.disruptions`); an operator's `fleet destroy` is
never held by them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fleet.core.times import now_iso

# a box its provider reports down (`fleet.core.states.DOWN`) loses nothing alive when destroyed


def allowance(wanted: int, fraction: float) -> int:
    """How many boxes of a role wanting `wanted` may go within one window."""
    return max(1, math.floor(fraction * wanted))


def recent(records: Sequence[dict[str, Any]], role: str, now: float,
           window_s: float) -> list[dict[str, Any]]:
    """The role's records within the window ending `now` (epoch seconds)."""
    return [r for r in records if r.get("role") == role
            and now - float(r.get("at_epoch", 0.0)) < window_s]


def refusal(records: Sequence[dict[str, Any]], role: str, wanted: int, fraction: float,
            window_s: float, now: float) -> str | None:
    """Why one more of the role's boxes may not be destroyed now; None when it may."""
    spent = len(recent(records, role, now, window_s))
    most = allowance(wanted, fraction)
    if spent < most:
        return None
    span = "the last hour" if window_s == 3600 else f"the last {window_s:g} s"
    return (f"disruption budget spent: {spent} destroyed in {span} (role {role} may lose "
            f"{most} of {wanted})")


def record(records: list[dict[str, Any]], role: str, label: str, why: str,
           now: float) -> None:
    records.append({"role": role, "label": label, "why": why, "at": now_iso(),
                    "at_epoch": now})


def prune(records: Sequence[dict[str, Any]], now: float,
          window_s: float) -> list[dict[str, Any]]:
    """The records still within the window (the memory keeps no more)."""
    return [r for r in records if now - float(r.get("at_epoch", 0.0)) < window_s]
