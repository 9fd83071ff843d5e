"""fleet's one error family.

`UsageError` and its kin are the operator's mistakes: the CLI prints one line `error: ...` and
exits 2, having changed nothing. `ProviderError` and its kin are a provider's refusal; each names
the provider and the call, and never carries a key.
"""

from __future__ import annotations


class FleetError(Exception):
    """Base of every error fleet raises on purpose."""

    exit_code = 1


class UsageError(FleetError):
    """The operator's input is wrong (bad config, label, role, flag). Exit status 2."""

    exit_code = 2


class ConfigError(UsageError):
    """fleet.toml is missing, malformed or names something unknown."""


class RegistryError(FleetError):
    """The box registry cannot be read or written (corrupt file, lock trouble)."""


class BudgetExceeded(FleetError):
    """A rent would push the projected day past the daily budget."""

    exit_code = 3


class ProviderError(FleetError):
    """A provider refused or failed a call."""

    def __init__(self, provider: str, call: str, detail: str, hint: str = "") -> None:
        self.provider = provider
        self.call = call
        self.detail = detail
        self.hint = hint
        text = f"{provider} {call}: {detail}"
        super().__init__(f"{text} ({hint})" if hint else text)


class NoCapacity(ProviderError):
    """The provider has no machine for the request right now; try another offer or later."""


class OfferGone(ProviderError):
    """The offer was taken or withdrawn between search and rent."""


class RateLimited(ProviderError):
    """The provider answered 429 and the retries ran out."""

    def __init__(self, provider: str, call: str, detail: str, retry_after: float | None = None):
        super().__init__(provider, call, detail, "slow down and try again")
        self.retry_after = retry_after


class AuthFailed(ProviderError):
    """The key was missing or refused: the operator's to fix, so exit status 2."""

    exit_code = 2
