"""Step 4 and 5 of a tick: what the roster is owed (`fleet.ops.owed`) rented within the
budget, and what was rented or resumed converted and checked."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleet.core.config import Role
from fleet.core.errors import BudgetExceeded, NoCapacity, OfferGone, ProviderError, UsageError
from fleet.core.times import now_iso
from fleet.core.verdicts import Owed
from fleet.ops import offers as offers_mod
from fleet.ops import owed as owed_mod
from fleet.ops import rent as rent_mod
from fleet.ops.loop.base import UNFIT_MACHINE_S, LoopBase, Tick, epoch
from fleet.state.loop_memory import Memory

if TYPE_CHECKING:
    from fleet.providers.base import Provider


class Renting(LoopBase):
    def owed(self, mem: Memory) -> list[Owed]:
        """What the roster is owed now (`fleet.ops.owed`), from the registry as it stands;
        the re-rents still owed are kept in `mem`."""
        mem.rerents, out = owed_mod.owed(self.cfg, self.reg.rows(), mem.rerents, mem.owed,
                                         now_iso())
        return out

    def _forget_unfit(self, mem: Memory) -> None:
        """A machine found unfit is passed over for UNFIT_MACHINE_S: its host may fix it."""
        now = time.time()
        for key, at in list(mem.unfit_machines.items()):
            if now - epoch(at) > UNFIT_MACHINE_S:
                del mem.unfit_machines[key]

    def _rent_owed(self, t: Tick, mem: Memory) -> list[str]:
        rented = []
        for o in self.owed(mem):
            label = self._try_rent(t, o, mem.unfit_machines)
            if label is None:
                t.owed.append(o)
                continue
            rented.append(label)
            if o.rerent_of:
                mem.rerents.remove(o)
                t.replaced[o.rerent_of] = label
            self._save(mem)  # the registry row is the truth; the memory follows it
        self._wait_ready(t, rented)
        return rented

    def _try_rent(self, t: Tick, o: Owed, unfit: Mapping[str, str]) -> str | None:
        """Rent one owed box; None (and `o.reason` set) when it cannot be rented now. Offers
        on a machine where a box was found unfit are passed over."""
        role: Role = self.cfg.role(o.role)
        p = self.providers.get(o.provider)
        if p is None:
            o.reason = f"provider refusing: no {o.provider} API key"
            return None
        found, failures = offers_mod.search(role, [p], card=o.card, gpus=o.gpus)
        if o.cloud:
            found = [f for f in found if f.cloud == o.cloud]
        fit = [f for f in found if f"{f.provider}/{f.machine_id}" not in unfit]
        if found and not fit:
            o.reason = (f"no admissible offer: the {len(found)} offered are on machines "
                        "where a box was found unfit")
            self._act(t, f"owed {o.role} {o.card} x{o.gpus} on {o.provider}: {o.reason}")
            return None
        found = fit
        if not found:
            o.reason = (f"provider refusing: {failures[0]}" if failures
                        else self._no_offer(role, p, o))
            self._act(t, f"owed {o.role} {o.card} x{o.gpus} on {o.provider}: {o.reason}")
            return None
        try:
            res = rent_mod.rent(self.cfg, self.reg, role, found, self.providers,
                                label=self._label(o), rerent_of=o.rerent_of, slot=o.slot,
                                account=self._account())
        except BudgetExceeded as e:
            o.reason = f"over budget: {e}"
        except (NoCapacity, OfferGone) as e:  # every offer tried went or had no machine
            o.reason = f"no capacity: {e}"
        except ProviderError as e:
            o.reason = f"provider refusing: {e}"
        except UsageError as e:  # e.g. a label the provider refuses: this box, not the loop
            o.reason = f"refused: {e}"
        else:
            what = f" replacing {o.rerent_of}" if o.rerent_of else " (owed by the roster)"
            self._act(t, f"{res.row.label}: rented {res.row.card} x{res.row.gpu_count} on "
                         f"{res.row.provider} at ${res.row.usd_per_hour:.3f}/h{what}")
            return res.row.label
        self._act(t, f"owed {o.role} {o.card} x{o.gpus} on {o.provider}: {o.reason}")
        return None

    @staticmethod
    def _no_offer(role: Role, p: Provider, o: Owed) -> str:
        """No capacity (nothing of that card listed) or no admissible offer (listed, but not
        on the pinned driver or CUDA)."""
        try:
            listed = p.offers(card=o.card, gpu_count=o.gpus)
        except ProviderError as e:
            return f"provider refusing: {e}"
        if o.cloud:
            listed = [f for f in listed if f.cloud == o.cloud]
        if listed:
            return (f"no admissible offer: {len(listed)} listed, none with driver "
                    f"{role.admitted_driver} and CUDA {'/'.join(role.allowed_cuda) or 'any'}"
                    f"{' and a direct p2p port' if role.p2p_port else ''}")
        tier = f" on the {o.cloud} tier" if o.cloud else ""
        return f"no capacity: no {o.card} x{o.gpus} offered{tier}"

    def _label(self, o: Owed) -> str | None:
        return self._successor(o.rerent_of, self.reg.rows()) if o.rerent_of else None

    def _converge(self, t: Tick, fresh: list[str]) -> None:
        labels = sorted(set(fresh) | set(t.converged))
        ready = [lb for lb in labels if (r := self.reg.get(lb)) is not None and r.host_key]
        t.converged = []
        if not ready:
            return
        started = time.monotonic()
        failure = self.converge_fn(self.cfg, ready)
        t.converge_s = round(time.monotonic() - started, 2)
        t.converged_after_s = round(time.monotonic() - self._started, 2)
        if failure:
            self._act(t, f"converging {', '.join(ready)}: {failure} (tried again next tick)")
            return
        t.converged = ready
        self._act(t, f"converged and checked: {', '.join(ready)}")
