"""The loop's shared state and helpers: what a tick says, the one destroy path as the loop
asks it (within the disruption budget), the account's listing, the fleet's label form."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from fleet.boxes.inventory import Built
from fleet.core import labels
from fleet.core.boxes import Row, is_standing
from fleet.core.config import Config
from fleet.core.errors import BudgetExceeded, FleetError, NotLeader, UsageError
from fleet.core.times import now_iso, parse_iso
from fleet.core.verdicts import Death, Health, Owed
from fleet.ops import budget, destroy, disruption, judgement
from fleet.ops import rent as rent_mod
from fleet.providers.base import Box
from fleet.providers.sync import View
from fleet.state.loop_memory import Memory
from fleet.state.registry import Registry

if TYPE_CHECKING:
    from fleet.providers.base import Provider
    from fleet.state.leader import Fence


@dataclass
class Late:
    """An unfinished rent's box to give up, and why; `sight`: only where the fleet's own
    SSH provably works this tick (the provider calls the box ready)."""

    row: Row
    box: Box
    why: str
    sight: bool


@dataclass
class Tick:
    number: int
    started_at: str
    actions: list[str] = field(default_factory=list)
    well: list[str] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)  # label -> what is wrong
    dead: dict[str, Death] = field(default_factory=dict)  # label -> why, this tick
    replaced: dict[str, str] = field(default_factory=dict)  # old label -> new label
    converged: list[str] = field(default_factory=list)
    owed: list[Owed] = field(default_factory=list)
    owed_ports: dict[str, str] = field(default_factory=dict)  # label -> why it is owed a port
    orphans: list[str] = field(default_factory=list)
    provider_errors: list[str] = field(default_factory=list)
    converge_s: float = 0.0  # of took_s: the deploy and checks of what was converged
    converged_after_s: float | None = None  # from the tick's start to the conversion's end
    took_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dead"] = {label: str(death) for label, death in self.dead.items()}
        d["owed"] = [o.for_page().to_dict() | {"rerent_of": o.rerent_of} for o in self.owed]
        return d

    def summary(self) -> str:
        return (f"tick {self.number}: {len(self.well)} well, {len(self.problems)} with "
                f"problems, {len(self.dead)} dead, {len(self.replaced)} replaced, "
                f"{len(self.owed)} owed, {len(self.owed_ports)} owed a port, "
                f"{len(self.orphans)} orphans, "
                f"{len(self.provider_errors)} provider errors ({self.took_s:.1f} s)")


Converge = Callable[[Config, list[str]], str | None]
UNFIT_MACHINE_S = 24 * 3600
MOVE_TRIES = 3  # moves of one box (for a place, or for a port) that may end without a move
MOVE_COOLDOWN_S = 6 * 3600.0  # before it stays: until the last of them ended this long ago


# what runs after each tick with its verdicts (the CLI writes the fleet page there)
AfterTick = Callable[["Tick", list[Health]], None]


class AfterTickNote(FleetError):
    """Raised by an after-tick hook that did its main work (the page) but not all of it."""


class LoopBase:
    """The loop's state within a tick and what every phase shares: saying, the one
    destroy path with the disruption budget, the account's listing, labels."""

    def __init__(self, cfg: Config, providers: Mapping[str, Provider], *,
                 destroy_orphans: bool = True, after_tick: AfterTick | None = None,
                 echo: Callable[[str], None] = print, converge_fn: Converge,
                 check_fn: Callable[[Config, Built], list[Health]],
                 peers_fn: Converge | None = None, fence: Fence | None = None) -> None:
        self.cfg, self.providers = cfg, dict(providers)
        # the leader's epoch (`fleet.state.leader`): every rent, destroy and memory save checks
        # it, so a loop that lost the lead acts no more (None: a loop no other can run beside)
        self.fence = fence
        self.reg = Registry(cfg.registry, fence)
        self.destroy_orphans = destroy_orphans
        self.after_tick = after_tick
        self.echo = echo
        self.converge_fn = converge_fn
        self.check_fn = check_fn
        self.peers_fn = peers_fn  # rewrites peers files (None: this loop leaves them alone)
        # the providers whose boxes answered the fleet's SSH this tick, no breaker open
        self._sees: set[str] = set()
        self._unsure: set[str] = set()  # rows whose box this tick cannot tell (`View.unsure`)
        # unfinished rents whose box its provider calls SSH-ready and the fleet's SSH did not
        # reach this tick: evidence for the breakers, like a standing box not answering
        self._unreached: set[str] = set()
        self._adopted: set[str] = set()  # "provider/id" of the boxes adopted this tick
        self._started = time.monotonic()  # the tick's start
        self._started_wall = time.time()
        self._listing: budget.Listing | BudgetExceeded | None = None  # `_account`, per tick

    def _save(self, mem: Memory) -> None:
        mem.save(self.cfg.registry, self.fence)

    def _act(self, t: Tick, line: str) -> None:
        t.actions.append(line)
        self.echo(line)

    def _standing_rows(self) -> list[Row]:
        return [r for r in self.reg.rows()
                if r.live and is_standing(self.cfg, r) and r.host_key and r.provider_id]

    def _by_role(self) -> dict[str, list[Row]]:
        """The converged standing boxes (their agent installed) by role."""
        out: dict[str, list[Row]] = {}
        for r in self._standing_rows():
            if r.standing and r.role in self.cfg.roles:
                out.setdefault(r.role, []).append(r)
        return out

    def _by_network(self) -> dict[str, list[Row]]:
        """The converged standing boxes by network (`Config.network_of`): the meshes."""
        out: dict[str, list[Row]] = {}
        for role, rows in self._by_role().items():
            out.setdefault(self.cfg.network_of(role), []).extend(rows)
        return out

    def _mesh_name(self, network: str) -> str:
        """How the loop's lines name a mesh: `role X` for a role in no network."""
        return f"role {network}" if self.cfg.network_roles(network) == (network,) \
            and network in self.cfg.roles else f"network {network}"

    def _spend(self, t: Tick, mem: Memory, role: str, label: str, why: str, *,
               judged: bool = True) -> dict[str, Any] | None:
        """Take one destroy of `role`'s box `label` from the disruption budget, saved before
        the destroy (a loop killed after it still counts it); None, said, when the budget is
        spent and the box is kept. A destroy that is not the loop's own judgement (`judged`
        False: its provider reports the box down) is never held, and counts all the same. A
        destroy that failed is never given back (its terminate may have gone through: the
        provider's answer lost, the box slow to leave the listing); trying the same box again
        within the window spends nothing more."""
        now, loop = time.time(), self.cfg.loop
        again = [r for r in disruption.recent(mem.disruptions, role, now,
                                              loop.disruption_window_s) if r["label"] == label]
        if again:  # its window runs from this try: the destroy may happen only now
            again[0].update(at=now_iso(), at_epoch=now)
            self._save(mem)
            return again[0]
        if judged:
            wanted = sum(w.count for w in self.cfg.roster if w.role == role)
            held = disruption.refusal(mem.disruptions, role, wanted, loop.disruption_fraction,
                                      loop.disruption_window_s, now)
            if held is not None:
                self._act(t, f"{label}: {held}; {label} kept ({why}; `fleet destroy {label}` "
                             "still works)")
                return None
        disruption.record(mem.disruptions, role, label, why, now)
        self._save(mem)
        return mem.disruptions[-1]

    def _spender(self, t: Tick, mem: Memory, label: str, why: str, *,
                 judged: bool = True) -> destroy.Spend:
        """The disruption budget as the destroy path asks it, for the row it re-read."""
        return lambda row: self._spend(t, mem, row.role, label, why, judged=judged) is not None

    def _destroy(self, t: Tick, order: destroy.Order, what: str,
                 spend: destroy.Spend | None = None) -> destroy.Destroyed | None:
        """`fleet.ops.destroy.destroy` for the loop: a refusal or a provider's failure is
        said (and tried again next tick), never raised; None then, or when `spend` kept it."""
        try:
            return destroy.destroy(self.cfg, self.reg, self.providers, order, spend=spend)
        except NotLeader:
            raise  # it acts no more: nothing of the tick goes on
        except UsageError as e:  # a guard refused (`destroy.Refused`), or no API key
            self._act(t, f"{order.label}: not destroyed ({what}): {e}")
        except FleetError as e:  # the provider failed, or could not be asked (by label)
            self._act(t, f"{order.label}: destroying {what} failed ({e}); tried again next "
                         "tick")
        return None

    def _destroy_row(self, t: Tick, row: Row, failed: set[str], what: str,
                     spend: destroy.Spend | None = None) -> bool:
        """Destroy the box of a row the registry owns, by its provider id, through the one
        destroy path; False (said) when that cannot be told or done this tick."""
        if row.provider in failed or not row.provider_id or row.label in self._unsure:
            return False  # its provider is silent on it this tick: nothing is destroyed blind
        order = destroy.Order(row.label, seen_id=row.provider_id, judged=True)
        return self._destroy(t, order, f"it ({what})", spend) is not None

    def _destroy_judged(self, t: Tick, mem: Memory, row: Row, failed: set[str],
                        what: str) -> bool:
        """`_destroy_row` for a box destroyed on the loop's own judgement: within the
        disruption budget only."""
        return self._destroy_row(t, row, failed, what,
                                 self._spender(t, mem, row.label, what))

    def _account(self) -> budget.Listing:
        """The account's listing the budget counts, read once a tick, at its first rent: the
        boxes rented after it are registry rows, which the budget counts anyway. A read that
        failed refuses every rent of the tick without asking the providers again (a 429 is
        not answered with more calls)."""
        if self._listing is None:
            try:
                self._listing = budget.listed(self.providers, "renting this tick")
            except BudgetExceeded as e:
                self._listing = e
        if isinstance(self._listing, BudgetExceeded):
            raise self._listing
        return self._listing

    def _wait_ready(self, t: Tick, rented: list[str]) -> None:
        """Pin the host keys of the boxes rented this tick once SSH answers; those not ready
        in time are resumed next tick (`_resume_unfinished`)."""
        if not rented:
            return
        try:
            rent_mod.wait_ready(self.cfg, self.reg, self.providers, rented)
        except FleetError as e:
            self._act(t, f"waiting for SSH on {', '.join(rented)}: {e}")

    def _successor(self, label: str, rows: list[Row]) -> str | None:
        """The label of the box taking over from `label` (a re-rent or a move): its `-r<n>`
        where `label` has the fleet's exact form; else None, a generated label. A person may
        well call the box replacing their `web1` `web1-r1`: found by that label, theirs
        would be taken for the fleet's, adopted, even destroyed."""
        if not self._form().match(label):
            return None
        return labels.rerent_label(label, {r.label for r in rows})

    def _gap(self, v: View, provider: str) -> str | None:
        """How many of `provider`'s live boxes its listing left out, where that is at least two
        and more than half of them: a gap across the provider (another account's key, an
        incident), in which no "no such box" is believed. None otherwise."""
        return judgement.gap([r.label for r in self.reg.rows()
                              if r.live and r.provider == provider and r.provider_id],
                             v.unlisted)

    def _role_of(self, label: str) -> str:
        """The role a label of this fleet's form (`_form`) begins with, the longest first."""
        return next(r for r in sorted(self.cfg.roles, key=len, reverse=True)
                    if label.startswith(f"{r}-"))

    def _form(self) -> re.Pattern[str]:
        return destroy.fleet_form(self.cfg, self.reg)


def peers_sig(rows: list[Row]) -> str:
    """A network's set of public p2p endpoints, as the peers files were last written for it."""
    return " ".join(sorted(f"{r.label}={r.public_ip}:{r.p2p_public_port}" for r in rows))


def epoch(iso: str) -> float:
    return parse_iso(iso).timestamp()
