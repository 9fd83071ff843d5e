"""Admissible offers for a role, cheapest first, across both providers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fleet.core import cards
from fleet.core.errors import ConfigError, ProviderError
from fleet.ops import ports

if TYPE_CHECKING:
    from fleet.core.config import Role
    from fleet.providers.base import Offer, Provider


class Unpriced(ProviderError):
    """Offers a provider listed without a price, left out of the search (never rented: a box
    with no price would count as free in the budget). Said beside the offers, among the
    search's failures, though the provider answered: it is no reason to think it offers more."""


def admissible(role: Role, offers: Iterable[Offer]) -> list[Offer]:
    """Drop offers whose advertised driver is not the one admitted for their card's vendor,
    and, in a role with GPU work, offers of a card the role could not admit (an AMD card
    without the AMD pair, a card whose vendor cannot be told).

    RunPod never advertises a driver (None): such offers stay, and admission after boot guards.
    """
    return [o for o in offers if _admits(role, o)]


def _admits(role: Role, o: Offer) -> bool:
    vendor = cards.vendor(o.card)
    if role.uses_gpu:
        if vendor is None:  # whose library would admit it cannot be told
            return False
        try:
            role.check_gpu_guard(vendor)  # an NVIDIA offer for an AMD-only role, and back
        except ConfigError:
            return False
    want = role.admitted_amdgpu if vendor == cards.AMD else role.admitted_driver
    return want is None or o.driver is None or o.driver == want


def wanted_stack(role: Role, card: str | None) -> dict[str, Any]:
    """What a search for `card` asks a provider for: the exact driver of the card's vendor and
    the CUDA (NVIDIA) or ROCm (AMD) lines the role allows. With no card, the role's NVIDIA
    driver, or its AMD pair where it names only that."""
    vendor = cards.vendor(card) if card else (
        cards.AMD if role.admitted_amdgpu and not role.admitted_driver else cards.NVIDIA)
    if vendor == cards.AMD:
        return {"driver": role.admitted_amdgpu, "cuda": (), "rocm": role.allowed_rocm}
    return {"driver": role.admitted_driver, "cuda": role.allowed_cuda, "rocm": ()}


def disks(role: Role, provider: str) -> tuple[int, int]:
    """(container disk, volume) GB a rent of `role` asks `provider` for.

    RunPod drops the container disk at every stop and restart and keeps the pod's volume
    (shared/research/providers.md, "Disks"): the fleet's root is the volume, as big as the
    role's disk. Vast keeps its one disk: no volume.
    """
    return role.disk_gb, role.disk_gb if provider == "runpod" else 0


def search(role: Role, providers: Iterable[Provider], card: str | None = None,
           gpus: int = 1, portless: bool = True) -> tuple[list[Offer], list[ProviderError]]:
    """Cheapest admissible offers for `role`; a provider that fails is reported, not fatal,
    and so are the offers it listed without a price (`Unpriced`: never admissible). Each
    provider is asked for offers priced for the storage the rent will ask it for (Vast
    counts the disk in its price).

    A role with a p2p port is offered boxes that map it (`ports.DIRECT`) first. Where no
    provider offers one, and `portless` allows, the offers that map none are searched and
    marked `portless`: a node that only dials out still serves, and the loop owes its box a
    port (`fleet.ops.ports`) until an offer maps one. Never while a provider did not answer
    (it may offer one), nor with `portless` off (a replacement for a port)."""
    direct = ports.direct(role)
    found, failures = _search(role, providers, card, gpus, direct)
    failed = [f for f in failures if not isinstance(f, Unpriced)]
    if found or failed or not direct or not portless:
        return found, failures  # a provider that did not answer may offer a port
    found, more = _search(role, providers, card, gpus, 0)
    return [replace(o, portless=True) for o in found], failures + more


def _search(role: Role, providers: Iterable[Provider], card: str | None, gpus: int,
            direct: int) -> tuple[list[Offer], list[ProviderError]]:
    found: list[Offer] = []
    failures: list[ProviderError] = []
    for p in providers:
        try:
            got = p.offers(card=card, gpu_count=gpus, direct_ports=direct,
                           disk_gb=sum(disks(role, p.name)), **wanted_stack(role, card))
        except ProviderError as e:
            failures.append(e)
            continue
        found.extend(admissible(role, got))
        unpriced = getattr(got, "unpriced", ())
        if unpriced:
            shown = ", ".join(unpriced[:5]) + (f" and {len(unpriced) - 5} more"
                                                if len(unpriced) > 5 else "")
            failures.append(Unpriced(p.name, "offers", f"{len(unpriced)} offer"
                                     f"{'s' if len(unpriced) > 1 else ''} with no price "
                                     f"skipped, never rented: {shown}"))
    found.sort(key=lambda o: (o.usd_per_hour, o.provider, o.offer_id))
    return found, failures
