"""One seed, one schedule of faults: what happens to the simulated cloud, tick by tick.

A schedule is a list of events, each at a tick; targets ("a box of the fleet") are chosen when
the event fires, from the seed, so a schedule replays exactly and a shortened one (events left
out) still makes sense. Faults stop at `calm`: from there the fleet must heal (L1).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

HEAL_TICKS = 16  # ticks after the faults stop within which the roster must be whole (L1)

# kind -> how often a schedule draws it (the weight), and its argument's choices
KINDS: dict[str, tuple[int, tuple[str, ...]]] = {
    "host_death": (3, ("",)),  # a fleet box's host dies (its provider reports it, later)
    "container_restart": (2, ("",)),  # its provider restarts the box's container
    "hang": (3, ("",)),  # a fleet box's sshd logs in and never runs the command
    "heal": (1, ("",)),  # every hung sshd answers again
    "cut": (2, ("vast", "runpod")),  # the operator's SSH path to one provider is down
    "restore": (2, ("",)),  # every SSH path is back
    "blind": (2, ("vast", "runpod")),  # the key lists an empty account (200, empty, no id)
    "see": (2, ("",)),  # every key lists its own account again
    "rate_limit": (2, ("vast", "runpod")),  # the next API calls answer 429
    "server_error": (2, ("vast", "runpod")),  # the next API calls answer 500
    "create_timeout": (2, ("vast", "runpod")),  # a create whose answer never comes
    "listing_gap": (2, ("",)),  # Vast's listing leaves a fleet box out
    "no_capacity": (1, ("vast", "runpod")),  # the next creates find no capacity
    "restore_registry": (1, ("",)),  # the registry replaced by a copy from earlier ticks
    "clock_step": (1, ("900", "3600")),  # the clock jumps forward
    "kill": (4, ("0", "1", "2", "3")),  # the loop SIGKILLed before its Nth provider change
    "kill_after": (2, ("0", "1")),  # ... right after its Nth change, before it hears back
    "second_registry": (1, ("",)),  # an operator starts a loop on another registry
    "mark_gone": (1, ("",)),  # an operator runs `fleet destroy LABEL --gone` on a fleet box
}
# another loop takes the lead (the leader's session dropped, a standby took over): the old
# loop's next tick must act on nothing. Drawn from a stream of its own, so that every seed's
# other events stay what they were before it existed
USURP_CHANCE = 0.4
# a fleet box's sshd serves another host key with no restart its provider lists (an impostor
# at its address, for all the fleet can tell): drawn from a stream of its own too
REKEY_CHANCE = 0.4


@dataclass(frozen=True)
class Event:
    tick: int
    kind: str
    arg: str = ""

    def __str__(self) -> str:
        return f"t{self.tick}:{self.kind}{'(' + self.arg + ')' if self.arg else ''}"


@dataclass
class Plan:
    seed: int
    ticks: int  # ticks in all
    calm: int  # the first tick with no fault: from here the roster must fill (L1)
    events: list[Event] = field(default_factory=list)
    spread: bool = True
    budget_usd: float = 200.0
    person_boxes: int = 1  # boxes a person rented by hand on the account, before the loop

    def describe(self) -> str:
        return (f"seed {self.seed}: {self.ticks} ticks, calm from t{self.calm}, spread "
                f"{self.spread}, budget ${self.budget_usd:g}, {self.person_boxes} person's "
                f"box(es); events: {' '.join(map(str, self.events)) or 'none'}")

    def without(self, index: int) -> Plan:
        return Plan(self.seed, self.ticks, self.calm,
                    self.events[:index] + self.events[index + 1:], self.spread,
                    self.budget_usd, self.person_boxes)


def draw(seed: int) -> Plan:
    rng = random.Random(f"fleet-sim/{seed}")
    faulty = rng.randint(6, 14)
    calm = 3 + faulty
    plan = Plan(seed, calm + HEAL_TICKS, calm, spread=rng.random() < 0.5,
                budget_usd=rng.choice((40.0, 200.0, 200.0, 1000.0)),
                person_boxes=rng.randint(0, 2))
    kinds = sorted(KINDS)
    weights = [KINDS[k][0] for k in kinds]
    for _ in range(rng.randint(2, 9)):
        kind = rng.choices(kinds, weights)[0]
        plan.events.append(Event(rng.randint(3, calm - 1), kind, rng.choice(KINDS[kind][1])))
    usurp = random.Random(f"fleet-sim/{seed}/usurp")
    if usurp.random() < USURP_CHANCE:
        plan.events.append(Event(usurp.randint(3, calm - 1), "usurp"))
    rekey = random.Random(f"fleet-sim/{seed}/rekey")
    if rekey.random() < REKEY_CHANCE:
        plan.events.append(Event(rekey.randint(3, calm - 1), "rekey"))
    # the faults a schedule left on are lifted at calm: no SSH cut, no blind key, no hang
    plan.events += [Event(calm, "restore"), Event(calm, "see"), Event(calm, "heal")]
    plan.events.sort(key=lambda e: e.tick)
    return plan
