"""The loop's judgement as pure functions of what one tick saw: which failures are more likely
the fleet's own blindness (or its provider's) than that many deaths, and when the sweep of
orphans cannot trust what it sees.

No provider call, no SSH command, no file: `fleet.ops.loop` gathers the listings and the SSH
answers, asks these, and acts on (and says) what they return. Each is a rule of
docs/operator.md's "What the fleet destroys", testable on plain sets of labels.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any


def many(failing: int, of: int) -> bool:
    """At least two, and more than half: the one threshold every guard here uses. A lone
    failure is never many (with one box the fleet cannot tell its own path from the box's)."""
    return failing >= 2 and 2 * failing > of


def fleet_blind(quiet: Collection[str], judged: Collection[str]) -> str | None:
    """Why no SSH death counts this tick across the whole fleet, or None: `quiet`, the boxes
    whose SSH did not answer (no one's path aside: a lost host, a hung login), are many of
    `judged`, the boxes probed."""
    if not many(len(quiet), len(judged)):
        return None
    return (f"{len(quiet)} of {len(judged)} boxes did not answer SSH at once: more likely the "
            "fleet's own side (its network, an SSH proxy, its key) than that many deaths")


def breakers(judged: Mapping[str, set[str]], unlisted: set[str], down: set[str],
             was_open: Collection[str], answered: Collection[str]) -> dict[str, str]:
    """The providers whose breaker is open, each with why. `judged`: per provider, the labels
    the tick judges there (probed over SSH, or live rows its listing left out; never those it
    reports exited or stopped). Open when many of them fail at once (left out of its listing,
    `unlisted`, or not answering SSH, `down`). Open on the last tick (`was_open`), it stays
    open while none of the provider's boxes answers SSH (`answered`: the providers some of
    whose boxes did) and some still fail: the path to it is not proven back."""
    out = {}
    for name, mine in sorted(judged.items()):
        unlisted_, quiet = mine & unlisted, mine & down
        failing = unlisted_ | quiet
        if many(len(failing), len(mine)):
            out[name] = (f"{len(failing)} of {len(mine)} fail at once: {len(unlisted_)} left "
                         f"out of its listing, {len(quiet)} not answering SSH")
        elif failing and name in was_open and name not in answered:
            out[name] = (f"still open: none of its boxes has answered SSH since it opened, "
                         f"and {len(failing)} of {len(mine)} still fail")
    return out


def gap(live: Collection[str], unlisted: Collection[str]) -> str | None:
    """How many of a provider's `live` boxes (rows with an id) its listing left out, where
    they are many: a gap across the provider (another account's key, an incident), in which
    no "no such box" is believed. None otherwise."""
    out = [lb for lb in live if lb in unlisted]
    return f"{len(out)} of its {len(live)} boxes" if many(len(out), len(live)) else None


def sweep_refusal(live: int, orphans: int, unrecorded: Sequence[str]) -> str | None:
    """Why no orphan of the fleet's form may be destroyed this tick, or None: the registry has
    no live row (a missing or mistyped path reads as empty), its `orphans` outnumber its `live`
    rows, or some carry a label it never recorded (`unrecorded`): every rent writes its row
    before the create, so the registry is behind the account."""
    if not live:
        return "the registry has no live box (a missing or wrong registry path reads as empty)"
    if orphans > live:
        return f"{orphans} orphans outnumber the registry's {live} live boxes"
    if unrecorded:
        more = " and more" if len(unrecorded) > 3 else ""
        return (f"the registry never recorded a rent of {', '.join(unrecorded[:3])}{more}, "
                "though every rent writes its row first: it is behind the account (restored "
                "from an older copy, or another copy of it rents)")
    return None


# the providers whose container disk, where a box's host keys live, is new after a restart
# (RunPod; Vast keeps its disk, so a changed key there is no restart's doing)
KEYS_NEW_ON_RESTART = frozenset({"runpod"})


def repin_refusal(provider: str, pinned_id: str | None, listed_id: str,
                  listed_machine: str | None, uptime_s: float | None,
                  then: Mapping[str, Any] | None) -> str | None:
    """Why a standing box that presents another host key than the one pinned is not re-pinned,
    or None: only its provider's own word that this is the same box, restarted since it last
    answered under the pinned key, re-pins it. That word is the same provider id on the same
    machine and an uptime it lists (`uptime_s`) below the uptime it listed when the box last
    answered (`then`: {"uptime_s", "machine"}, the loop's record). Only the provider's clock
    counts: the fleet's own (skewed, stepped, another leader's) never enters. Whatever cannot
    be told refuses; the box is then judged as one whose SSH does not answer, as any other."""
    if provider not in KEYS_NEW_ON_RESTART:
        return f"{provider} keeps a box's disk, and its host keys, across a restart"
    if not pinned_id or listed_id != pinned_id:
        return f"its provider lists it as {listed_id}, not the pinned {pinned_id}"
    if then is None:
        return "the fleet has no record of its uptime when it last answered under the pinned key"
    was_up, was_on = then.get("uptime_s"), then.get("machine")
    if not isinstance(was_up, int | float) or not was_up > 0:
        return "its provider listed no uptime when it last answered under the pinned key"
    if uptime_s is None or not uptime_s > 0:  # NaN refuses too
        return "its provider lists no uptime for it"
    if was_on is not None and listed_machine != was_on:
        return f"it is listed on machine {listed_machine}, not {was_on} where it last answered"
    if not uptime_s < was_up:
        return (f"its provider lists no restart since it last answered (up {uptime_s:.0f} s "
                f"now, {was_up:.0f} s then)")
    return None
