"""The fleet's words for the states of things, as enums: a box's status, its kind, a box's
state in a publish, a death's kind, a node's release order. Each value is the word the fleet
has always stored and said, so a registry row, a tick's JSON and every line stay the same
(a `StrEnum` member is its word: it compares, formats and dumps as that string).

Imports the standard library only: every layer may read it, as supervisord's `states.py`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self


class _Stored(StrEnum):
    """A word a stored row holds: `read` gives its member, and keeps a word the fleet never
    writes (a row edited by hand) as it reads, a value of its own that no set contains."""

    @classmethod
    def read(cls, word: str) -> Self:
        try:
            return cls(word)
        except ValueError:
            odd = str.__new__(cls, word)
            odd._name_ = odd._value_ = word
            return odd

    def __reduce_ex__(self, protocol: object) -> tuple[object, tuple[str]]:
        return type(self).read, (self._value_,)  # a hand edit's word pickles too


class BoxStatus(_Stored):
    """A box's status: what its provider lists (mapped at each provider's edge: RunPod's
    `desiredStatus`, Vast's `actual_status`), and what the fleet records of its end.

    renting -> provisioning -> running (-> stopped | exited | unknown) ... -> destroyed,
    vanished (its provider had no such box any more) or failed (the rent never landed)."""

    RENTING = "renting"  # the row is written, the provider not yet answered
    PROVISIONING = "provisioning"
    RUNNING = "running"
    STOPPED = "stopped"  # stopped by its user (or a spot bid outbid): bills its storage
    EXITED = "exited"  # its container ended on its own (a crash, a spot reclaim)
    UNKNOWN = "unknown"  # its provider lost the host's heartbeat
    DESTROYED = "destroyed"
    VANISHED = "vanished"
    FAILED = "failed"
    # a box its provider, asked by id, says it has no more: probed where it last was
    GONE = "gone"

    def is_live(self) -> bool:
        """May it bill? (Rented and not yet known to be over.)"""
        return self in LIVE



LIVE = frozenset({BoxStatus.RENTING, BoxStatus.PROVISIONING, BoxStatus.RUNNING,
                  BoxStatus.STOPPED, BoxStatus.EXITED, BoxStatus.UNKNOWN})
# a rent not finished: its box not yet running
UNFINISHED = frozenset({BoxStatus.RENTING, BoxStatus.PROVISIONING})
# how a provider says a box is down: destroyed, it loses nothing alive
DOWN = frozenset({BoxStatus.EXITED, BoxStatus.STOPPED})
# the ends a row records
ENDED = frozenset({BoxStatus.DESTROYED, BoxStatus.VANISHED, BoxStatus.FAILED})


class BoxKind(_Stored):
    """A role's (and its boxes') kind (docs/design.md, "Two kinds of box")."""

    STANDING = "standing"
    ONESHOT = "oneshot"


class PublishState(StrEnum):
    """A standing box's state in a publish of a node release."""

    UNTOUCHED = "untouched"
    SWITCHED = "switched"
    AHEAD = "ahead"
    REVERTED = "reverted"
    FAILED = "failed"
    UNREACHABLE = "unreachable"


class DeathKind(StrEnum):
    """Why the loop counts a standing box dead on a tick: it is gone or does not answer
    (dead), or it answers but must not run the work (unfit: its agent refused admission)."""

    DEAD = "dead"
    UNFIT = "unfit"


class ReleaseOrder(StrEnum):
    """Where a box's node stands against the wanted release, as a check's problem names it
    (`node: behind: runs v1 (...), wanted v2 (...)`)."""

    BEHIND = "behind"
    AHEAD = "ahead"


NODE_PROBLEM = "node: "  # how a check's problems with the node begin


def node_release(problem: str) -> ReleaseOrder | None:
    """The release order a check's problem names (`node: behind: ...`), or None: another
    problem, or a node that runs a release of no known order."""
    for order in ReleaseOrder:
        if problem.startswith(f"{NODE_PROBLEM}{order}"):
            return order
    return None
