"""The one HTTP path both provider clients use: retries, backoff, typed errors, no key leaks.

Retried: 429, 5xx, connection failures and timeouts, with capped exponential backoff and jitter;
a Retry-After header wins over the backoff. A call that may have changed state on the provider
(`idempotent=False`, i.e. a create) is not retried blindly when its outcome is unknown (timeout
after sending, dropped connection, 5xx): it raises `OutcomeUnknown` so the caller can look the
label up first. Every message that leaves this module has the key scrubbed out of it.
"""

from __future__ import annotations

import email.utils
import os
import random
import ssl
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from fleet.core.errors import AuthFailed, OutcomeUnknown, ProviderError, RateLimited

Sleep = Callable[[float], None]

# Sent before the server saw anything: always safe to send again.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_SNIPPET = 300  # characters of a response body quoted in an error


_TLS: dict[tuple[str | None, str | None], ssl.SSLContext] = {}


def _tls() -> ssl.SSLContext:
    """The TLS context httpx makes for a client by default (its CA bundle, or the one
    SSL_CERT_FILE or SSL_CERT_DIR names), made once per process and shared by every provider's
    client: loading the CA bundle is most of what making a client costs, and the loop makes
    one for each provider every `fleet loop --once`."""
    where = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    if where not in _TLS:
        _TLS[where] = httpx.create_ssl_context()
    return _TLS[where]


@dataclass(frozen=True)
class Secret:
    """An API key that never shows itself in a repr, a log line or a traceback's locals."""

    value: str

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5  # tries in all, the first included
    base_delay: float = 0.5  # seconds before the first retry, doubled each time
    max_delay: float = 20.0  # cap on one backoff wait
    max_retry_after: float = 120.0  # a longer Retry-After is handed to the caller, not slept

    def backoff(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """Wait before retry number `retry` (0-based): "equal jitter", half fixed, half random."""
        d = min(self.max_delay, self.base_delay * 2**retry)
        return d / 2 + rand() * d / 2


def retry_after(resp: httpx.Response | urllib.error.HTTPError) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date), None when absent or bad."""
    raw = resp.headers.get("Retry-After")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class Http:
    """An httpx client bound to one provider: base URL, bearer key, per-call timeout, retries."""

    def __init__(
        self,
        provider: str,
        base_url: str,
        key: Secret,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        sleep: Sleep = time.sleep,
        rand: Callable[[], float] = random.random,
        transport: httpx.BaseTransport | None = None,
        hint_env: str = "",
    ) -> None:
        self.provider = provider
        self.retry = retry or RetryPolicy()
        self.sleep = sleep
        self.rand = rand
        self.timeout = timeout
        self._key = key
        self._hint_env = hint_env
        # httpx masks the Authorization header in its own reprs.
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {key.value}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
            verify=True if transport is not None else _tls(),  # a test's transport has its own
        )

    def __repr__(self) -> str:
        return f"Http({self.provider!r}, {str(self._client.base_url)!r})"

    def close(self) -> None:
        self._client.close()

    # -- messages ---------------------------------------------------------------------------

    def scrub(self, text: str) -> str:
        key = self._key.value
        return text.replace(key, "***") if key else text

    def error(
        self, cls: type[ProviderError], call: str, detail: str, hint: str = ""
    ) -> ProviderError:
        """Build a typed error with the key scrubbed from every part of it."""
        return cls(self.provider, call, self.scrub(detail), self.scrub(hint))

    def body_snippet(self, resp: httpx.Response) -> str:
        text = " ".join(resp.text.split())
        return self.scrub(text[:_SNIPPET] + ("..." if len(text) > _SNIPPET else ""))

    # -- the call ---------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        call: str,
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
        idempotent: bool = True,
        final: Callable[[httpx.Response], bool] | None = None,
    ) -> httpx.Response:
        """Send one call, retrying what is safe to retry; return any other response.

        + call: the provider call's name, for errors ("podTerminate", "PUT /asks/{id}/")
        + idempotent: False for creates: an unknown outcome raises OutcomeUnknown, unretried
        + final: says a 429 is not worth retrying (a daily quota) and should raise at once
        Raises AuthFailed on 401/403, RateLimited when 429s outlast the retries, ProviderError
        when 5xx or connection failures do.
        """
        policy = self.retry
        for attempt in range(policy.attempts):
            last = attempt == policy.attempts - 1
            try:
                resp = self._client.request(
                    method, path, json=json, params=params,
                    timeout=self.timeout if timeout is None else timeout,
                )
            except httpx.TransportError as exc:
                what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if not idempotent and not isinstance(exc, _NOT_SENT):
                    raise self.error(OutcomeUnknown, call, f"no answer ({what})") from None
                if last:
                    raise self.error(
                        ProviderError, call, f"no answer after {policy.attempts} tries ({what})",
                        "check the network and the provider's status page",
                    ) from None
                self.sleep(policy.backoff(attempt, self.rand))
                continue

            status = resp.status_code
            if status in (401, 403):
                raise self.error(
                    AuthFailed, call, f"HTTP {status}: {self.body_snippet(resp)}",
                    f"check {self._hint_env}" if self._hint_env else "check the API key",
                )
            if status == 429:
                wait = retry_after(resp)
                if last or (final is not None and final(resp)) or (
                    wait is not None and wait > policy.max_retry_after
                ):
                    err = RateLimited(
                        self.provider, call,
                        f"HTTP 429 after {attempt + 1} tries: {self.body_snippet(resp)}", wait,
                    )
                    raise err from None
                self.sleep(wait if wait is not None else policy.backoff(attempt, self.rand))
                continue
            if status >= 500:
                detail = f"HTTP {status}: {self.body_snippet(resp)}"
                if not idempotent:
                    raise self.error(OutcomeUnknown, call, detail)
                if last:
                    raise self.error(
                        ProviderError, call, f"{detail} (after {policy.attempts} tries)",
                        "the provider is failing; try again later",
                    )
                wait = retry_after(resp)
                self.sleep(
                    min(wait, policy.max_retry_after) if wait is not None
                    else policy.backoff(attempt, self.rand)
                )
                continue
            return resp
        raise AssertionError("unreachable")  # the loop returns or raises on its last attempt

    def json(self, resp: httpx.Response, call: str) -> Any:
        """The body as JSON, or a ProviderError quoting (scrubbed) what came instead."""
        try:
            return resp.json()
        except ValueError:
            raise self.error(
                ProviderError, call, f"HTTP {resp.status_code}, not JSON: {self.body_snippet(resp)}"
            ) from None
