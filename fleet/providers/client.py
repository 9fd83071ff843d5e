"""What both clients do the same way: idempotent rent, destroy-until-gone, label lookup.

A concrete client speaks its wire format in four hooks (`_create`, `_terminate`, `_by_label`,
`box`); this class holds the rules that keep money safe, so they exist once:

* a label rents at most one box: look it up before the first create, and after any create whose
  outcome is unknown (timeout, dropped connection, 5xx) before trying again;
* once a create's outcome was unknown, nothing after it is reported as the plain failure it
  looks like (an offer gone may be the first create's doing): the label is looked up again,
  and a box not found is `RentOutcomeUnknown` (a box may exist under the label);
* if duplicates appear anyway (a create that landed after its lookup), all but one are destroyed;
* a destroy is done only when the provider no longer lists the box, and "no such box" is read
  as gone only for a box this key's account is known to have held (the client saw it there:
  in a listing, a lookup or a create's answer). Providers say "no such box" alike for a box
  that went and for one on another account; a key that opens another account or team must
  not make the fleet's boxes read as destroyed while they bill on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Self

from fleet.core.errors import OutcomeUnknown, ProviderError, RentOutcomeUnknown, UsageError
from fleet.providers.base import Box, Offer, RentRequest, Unreadable, oldest_first, price

if TYPE_CHECKING:
    from fleet.providers.http import Http

# RunPod pod names work up to about 60 characters; Vast allows more. One rule for both.
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,59}$")


def check_label(label: str) -> None:
    if not _LABEL.match(label):
        raise UsageError(
            f"bad label {label!r}: 1-60 characters of letters, digits, '.', '_' or '-'"
        )


def p2p_public_port(ports: dict[int, int], p2p_port: int | None) -> int | None:
    """The public side of the p2p port: the named one, else the only non-SSH TCP port."""
    if p2p_port is not None:
        return ports.get(p2p_port)
    others = [public for internal, public in ports.items() if internal != 22]
    return others[0] if len(others) == 1 else None


class Client:
    """Shared behaviour of the RunPod and Vast clients (see the module docstring)."""

    name: str = ""
    label_field = "label"  # the key of a box's label in the provider's rows
    price_field = "dph_total"  # the key of its price in USD per hour

    def __init__(
        self,
        http: Http,
        *,
        p2p_port: int | None = None,
        destroy_polls: int = 60,
        poll_interval: float = 2.0,
    ) -> None:
        self.http = http
        self.p2p_port = p2p_port
        self.destroy_polls = destroy_polls
        self.poll_interval = poll_interval
        # ids this client's key has been shown on its account: a box there cannot move to
        # another account, so "no such box" for one of them later means it went
        self._held: set[str] = set()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.http!r})"

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- hooks a client implements ----------------------------------------------------------

    def _create(self, offer: Offer, req: RentRequest) -> Box:
        raise NotImplementedError

    def _terminate(self, box_id: str) -> None:
        """Ask the provider to destroy the box; a box already gone is not an error."""
        raise NotImplementedError

    def _by_label(self, label: str) -> list[Box]:
        raise NotImplementedError

    def box(self, box_id: str) -> Box | None:
        raise NotImplementedError

    def _box(self, raw: dict[str, Any]) -> Box:
        """One of the provider's rows as a Box; raises on a row of another shape."""
        raise NotImplementedError

    # -- shared rules -----------------------------------------------------------------------

    def _read(self, raw: Any) -> Box | Unreadable:
        """One listing row: its Box, or what can be read of it and why not the rest (one odd
        row must not hide the others)."""
        try:
            box = self._box(raw)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            known = raw if isinstance(raw, dict) else {}
            why = self.http.scrub(f"{type(e).__name__}: {e}"[:200])
            got = Unreadable(self.name, _text(known.get("id")),
                             _text(known.get(self.label_field)), why,
                             price(known.get(self.price_field)))
            if got.box_id is not None:
                self._held.add(got.box_id)
            return got
        self._held.add(box.box_id)
        return box

    def _saw(self, box_id: str) -> None:
        """Note that this key's account holds `box_id` (a create's answer named it)."""
        self._held.add(box_id)

    def _readable(self, raw: Any, call: str) -> Box:
        """The Box of an answer about one box; a row that cannot be read is a ProviderError,
        never "no such box"."""
        got = self._read(raw)
        if isinstance(got, Unreadable):
            raise self.http.error(ProviderError, call, str(got))
        return got

    def _labelled(self, label: str, rows: Iterable[Box | Unreadable], call: str) -> list[Box]:
        """The boxes under `label`; an unreadable row that may carry it is a ProviderError (a
        rent must not take it for no box, nor a lookup for none)."""
        found = []
        for b in rows:
            if isinstance(b, Unreadable):
                if b.label in (None, label):
                    raise self.http.error(ProviderError, call, str(b))
            elif b.label == label:
                found.append(b)
        return found

    def find_by_label(self, label: str) -> Box | None:
        """The box carrying `label`, or None. Looks only; duplicates are rent's business."""
        found = sorted(self._by_label(label), key=oldest_first)
        return found[0] if found else None

    def rent(self, offer: Offer, req: RentRequest) -> Box:
        """Rent `offer` under `req.label`; never more than one box per label.

        Returns the box as the provider first reports it (usually "provisioning"); poll `box()`
        until `ssh_ready`. Raises NoCapacity, OfferGone, RateLimited, AuthFailed or
        ProviderError when the only create sent was refused (or none was sent), and
        RentOutcomeUnknown when a create's outcome was unknown and no box with the label was
        found (a box may exist: look the label up again before renting it anew).
        """
        if offer.provider != self.name:
            raise UsageError(f"{offer.provider} offer {offer.offer_id} given to {self.name}")
        check_label(req.label)
        existing = self._keep_one(self._by_label(req.label))
        if existing is not None:
            return existing  # rented before (an earlier run); renting again would bill twice
        unknown: OutcomeUnknown | None = None
        policy = self.http.retry
        for attempt in range(policy.attempts):
            try:
                box = self._create(offer, req)
                self._saw(box.box_id)
            except OutcomeUnknown as e:
                unknown = e
                # give a create still in flight time to land before looking for it
                self.http.sleep(policy.backoff(attempt, self.http.rand))
                found = self._look_again(req.label, unknown)
                if found is not None:
                    return found
                continue
            except ProviderError as e:
                if unknown is None:
                    raise  # the only create sent: its failure says what it says
                # e.g. OfferGone because the create we lost took the machine
                found = self._look_again(req.label, unknown)
                if found is not None:
                    return found
                raise self._outcome_unknown(req.label, unknown, f"then {e}") from e
            if unknown is not None:
                # an earlier create we gave up on may have landed after its lookup
                self._keep_one(self._by_label(req.label), keep=box.box_id)
            return box
        assert unknown is not None
        raise self._outcome_unknown(
            req.label, unknown,
            f"no box labelled {req.label} after {policy.attempts} tries")

    def _look_again(self, label: str, unknown: OutcomeUnknown) -> Box | None:
        """The box carrying `label` after a create of unknown outcome (extras destroyed), or
        None; a lookup that fails is RentOutcomeUnknown."""
        try:
            return self._keep_one(self._by_label(label))
        except ProviderError as e:
            raise self._outcome_unknown(label, unknown, f"looking it up failed: {e}") from e

    def _outcome_unknown(self, label: str, unknown: OutcomeUnknown,
                         then: str) -> RentOutcomeUnknown:
        return RentOutcomeUnknown(
            self.name, "rent", f"{unknown.detail}; {then}",
            f"a box labelled {label} may exist: look for {label} in the {self.name} console, "
            "or let the fleet look it up again, before renting it again",
        )

    def _keep_one(self, boxes: Iterable[Box], keep: str | None = None) -> Box | None:
        """Of boxes sharing one label keep `keep` (else the oldest id) and destroy the rest.

        Returns the kept box when it is among `boxes`.
        """
        found = sorted(boxes, key=oldest_first)
        kept = keep or (found[0].box_id if found else None)
        for extra in found:
            if extra.box_id != kept:
                self.destroy(extra.box_id)
        return next((b for b in found if b.box_id == kept), None)

    def destroy(self, box_id: str) -> None:
        """Destroy the box and wait until the provider no longer lists it (bounded).

        "No such box" is gone only for a box this key's account is known to have held (see
        the module docstring): a box this client never saw there, and that the provider does
        not show now, is a ProviderError: the key may open another account, where the
        fleet's box is unknown and still bills. Nothing is sent to destroy it then.
        """
        if box_id not in self._held:
            self.box(box_id)  # shown to this key now (even as gone): its account's
        if box_id not in self._held:
            raise self.http.error(
                ProviderError, "destroy",
                f"{box_id}: no such box on this key's account: the key may point at another "
                "account; not read as destroyed",
                f"check that the key opens the account {box_id} was rented on",
            )
        self._terminate(box_id)
        for _ in range(self.destroy_polls):
            if self.box(box_id) is None:
                return
            self.http.sleep(self.poll_interval)
        waited = self.destroy_polls * self.poll_interval
        raise ProviderError(
            self.name, "destroy", f"box {box_id} is still listed {waited:.0f}s after destroy",
            "it may still bill: check the provider's console and destroy it there",
        )


def _text(value: Any) -> str | None:
    """A row's id or label as text, or None where it is missing or not a plain value."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        return None
    return str(value)
