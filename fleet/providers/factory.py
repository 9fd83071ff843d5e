"""Provider clients from the environment.

`get_provider("runpod" | "vast")` builds a client from the environment: the base URL
(RUNPOD_API_BASE_URL, VAST_URL) and the key (RUNPOD_API_KEY, VAST_API_KEY, or the providers'
key files). A missing key raises fleet.core.errors.AuthFailed naming the variable to set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleet.core.config import KEY_ENV, PROVIDERS
from fleet.core.errors import AuthFailed, UsageError
from fleet.providers import runpod, vast
from fleet.providers.http import Http, RetryPolicy
from fleet.providers.keys import resolve_key

if TYPE_CHECKING:
    from fleet.providers.base import Provider

AnyClient = runpod.RunPod | vast.Vast

_CLASSES: dict[str, tuple[type[AnyClient], Callable[[], str]]] = {
    "runpod": (runpod.RunPod, runpod.base_url),
    "vast": (vast.Vast, vast.base_url),
}


def get_provider(
    name: str,
    *,
    timeout: float = 30.0,
    retry: RetryPolicy | None = None,
    p2p_port: int | None = None,
    destroy_polls: int = 60,
    poll_interval: float = 2.0,
    **http_kw: Any,
) -> AnyClient:
    """A client for `name`, configured from the environment.

    + timeout: seconds per HTTP call
    + retry: attempts and backoff (default: 5 tries, 0.5 s doubling, capped at 20 s)
    + p2p_port: the internal port whose public side is `Box.p2p_public_port` (default: the
      only exposed TCP port other than 22)
    + destroy_polls, poll_interval: how long `destroy` waits for the box to leave the listing
    + http_kw: passed to `Http` (sleep, rand, transport), for tests

    Example: `with get_provider("vast") as vast: boxes = vast.boxes()`
    """
    if name not in _CLASSES:
        raise UsageError(f"unknown provider {name!r} (one of: {', '.join(PROVIDERS)})")
    cls, url = _CLASSES[name]
    http = Http(
        name, url(), resolve_key(name), timeout=timeout, retry=retry, hint_env=KEY_ENV[name],
        **http_kw,
    )
    return cls(http, p2p_port=p2p_port, destroy_polls=destroy_polls, poll_interval=poll_interval)


def all_providers(**kw: Any) -> dict[str, Provider]:
    """Every provider the operator has a key for, by name (an operator may use only one);
    AuthFailed when there is a key for none."""
    out: dict[str, Provider] = {}
    missing: list[AuthFailed] = []
    for name in PROVIDERS:
        try:
            out[name] = get_provider(name, **kw)
        except AuthFailed as e:
            missing.append(e)
    if not out:
        raise missing[0]
    return out


__all__ = ["AnyClient", "all_providers", "get_provider"]
