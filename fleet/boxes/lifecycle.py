"""A rented box between its provider and the registry: looked up, recorded, pinned, destroyed.

What renting, the loop and teardown all do with a box once it exists: copy the provider's
listing into its row (`record`), pin its host key once SSH answers (`host_key_if_ready`,
`pin`), find the box an unfinished rent left (`find_unfinished`), and destroy every box under a
label until the provider lists none (`destroy_by_label`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.boxes.sshkeys import fetch_host_key
from fleet.core.boxes import Row, unfinished
from fleet.core.config import KEY_ENV, Role
from fleet.core.errors import FleetError, ProviderError, UsageError

if TYPE_CHECKING:
    from fleet.providers.base import Box, Provider
    from fleet.state.registry import Registry


def provider_for(providers: dict[str, Provider], name: str, what: str) -> Provider:
    """The client for `name`, or a UsageError saying which key to set (nothing changed)."""
    p = providers.get(name)
    if p is None:
        raise UsageError(f"{what}: no {name} API key (set {KEY_ENV.get(name, 'its key')}); "
                         "nothing was changed")
    return p


def check_resume(row: Row, role: Role, provider: str | None) -> None:
    """Refuse (one UsageError line) renting under `row`'s label unless that resumes its
    unfinished rent with the same role and provider."""
    label = row.label
    if row.destroyed_at is not None or row.status in ("destroyed", "failed"):
        what = "its rent failed" if row.status == "failed" else f"its box was {row.status}"
        raise UsageError(f"label {label!r} is already in the registry: {what} at "
                         f"{row.destroyed_at}; labels are not reused, pick another")
    if not unfinished(row):
        raise UsageError(f"label {label!r} is already in the registry: a live box "
                         f"({row.status} on {row.provider}, id {row.provider_id}); "
                         "pick another label")
    if row.role != role.name:
        raise UsageError(f"label {label!r} was being rented for role {row.role}, not "
                         f"{role.name}: run `fleet rent {row.role} --label {label}` to resume it")
    if provider and provider != row.provider:
        raise UsageError(f"label {label!r} was being rented on {row.provider}: run it without "
                         f"--provider or with --provider {row.provider} to resume it")


def cannot_ask(e: ProviderError, label: str, again: str) -> FleetError:
    """The one-line refusal when a provider cannot say whether a box carries `label`."""
    err = FleetError(f"cannot look {label} up at {e.provider} ({e}); nothing was changed: "
                     f"run `{again}` again once {e.provider} answers")
    err.exit_code = e.exit_code
    return err


def find_unfinished(p: Provider, row: Row) -> Box | None:
    """The box an unfinished rent left at its provider: by its recorded id, else, while it
    has none, by its label (the rent's idempotency key). Once the id is known, no such box
    means none: another box under the label (a person's, under a hand-given one) is never
    taken for it. A ProviderError means the provider could not say."""
    if row.provider_id:
        return p.box(row.provider_id)
    return p.find_by_label(row.label)


def destroy_by_label(p: Provider, reg: Registry, label: str, again: str,
                     rounds: int = 5) -> list[str]:
    """Destroy whatever `p` lists under `label` (a row that never learnt its box's id) and
    return the ids destroyed; done only once the provider lists no box carrying it.

    Each id found is recorded on the row before it is destroyed, so a destroy that fails
    leaves the row pointing at the box. A lookup that fails is `cannot_ask` (nothing changed);
    a box still listed after `rounds` lookups is a ProviderError (it may still bill).
    """
    gone: list[str] = []
    for _ in range(rounds):
        try:
            box = p.find_by_label(label)
        except ProviderError as e:
            if not gone:
                raise cannot_ask(e, label, again) from None
            raise
        if box is None:
            return gone
        reg.update(label, provider_id=box.box_id)
        p.destroy(box.box_id)  # returns once the provider no longer lists it
        gone.append(box.box_id)
    raise ProviderError(p.name, "destroy", f"a box labelled {label} is still listed after "
                        f"destroying {', '.join(gone)}",
                        "it may still bill: check the provider's console and destroy it there")


def lookup(p: Provider, label: str) -> Box | None:
    try:
        return p.find_by_label(label)
    except ProviderError:
        return None


def record(reg: Registry, label: str, box: Box) -> Row:
    """Copy what the provider says of a box into its row (the driver only where it says one).
    The price is never lowered: a listing that shows none (0) or less must not make a live
    box count as cheaper than the price its rent was checked at."""
    old = reg.get(label)
    price = max(box.usd_per_hour, old.usd_per_hour if old is not None else 0.0)
    changes = dict(
        provider_id=box.box_id, status=box.status, usd_per_hour=price,
        ssh_host=box.ssh_host, ssh_port=box.ssh_port, public_ip=box.public_ip,
        p2p_public_port=box.p2p_public_port)
    if box.driver:
        changes["driver"] = box.driver
    if box.place:
        changes["place"] = box.place
    return reg.update(label, **changes)


def host_key_if_ready(box: Box) -> str | None:
    """The host key of a box that is SSH-ready, or None while it is not (yet)."""
    if not box.ssh_ready:
        return None
    try:
        return fetch_host_key(box.ssh_host or "", box.ssh_port or 22, timeout=5)
    except FleetError:
        return None  # the endpoint is published before sshd answers


def pin(reg: Registry, row: Row, key: str) -> Row:
    """Pin `key` as the row's host key; a box presenting another than the one pinned is
    refused."""
    if row.host_key and row.host_key != key:
        raise FleetError(f"{row.label}: host key changed since it was pinned; not trusting it")
    return reg.update(row.label, host_key=key)


def repin(reg: Registry, row: Row, key: str) -> Row:
    """Pin `key` in place of the row's pinned key, on its provider's word that this is the
    same box restarted (`fleet.ops.judgement.repin_refusal`, the caller's to ask). The
    known_hosts file is the caller's to rewrite: that closes the master made under the old
    key (`sshkeys.write_known_hosts`)."""
    return reg.update(row.label, host_key=key)
