"""Admissible offers for a role, cheapest first, across both providers."""

from __future__ import annotations

from collections.abc import Iterable

from fleet.config import Role
from fleet.errors import ProviderError
from fleet.providers.base import Offer, Provider


def admissible(role: Role, offers: Iterable[Offer]) -> list[Offer]:
    """Drop offers whose advertised driver is not the admitted one.

    RunPod never advertises a driver (None): such offers stay, and admission after boot guards.
    """
    want = role.admitted_driver
    return [o for o in offers if want is None or o.driver is None or o.driver == want]


def search(role: Role, providers: Iterable[Provider], card: str | None = None,
           gpus: int = 1) -> tuple[list[Offer], list[ProviderError]]:
    """Cheapest admissible offers for `role`; a provider that fails is reported, not fatal."""
    found: list[Offer] = []
    failures: list[ProviderError] = []
    for p in providers:
        try:
            got = p.offers(card=card, gpu_count=gpus, driver=role.admitted_driver,
                           direct_ports=1 if role.p2p_port else 0, cuda=role.allowed_cuda)
        except ProviderError as e:
            failures.append(e)
            continue
        found.extend(admissible(role, got))
    found.sort(key=lambda o: (o.usd_per_hour, o.provider, o.offer_id))
    return found, failures
