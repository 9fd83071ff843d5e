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


class StateError(RegistryError):
    """The state database cannot be reached, opened or migrated."""


class NotLeader(FleetError):
    """This loop no longer leads (another took over, or its session to the database dropped):
    it acts no more and campaigns again."""


class BudgetExceeded(FleetError):
    """A rent would push the projected day past the daily budget."""

    exit_code = 3


class ProviderError(FleetError):
    """A provider refused or failed a call.

    `refused` says the provider answered and said no, so the call did not take effect (an
    HTTP 4xx answer, a GraphQL error with no result, an offer gone): a create refused so left
    no box. False where it may have taken effect (a timeout, a dropped connection, a 5xx, an
    answer that could not be read) or where nothing says.
    """

    refused = False

    def __init__(self, provider: str, call: str, detail: str, hint: str = "") -> None:
        self.provider = provider
        self.call = call
        self.detail = detail
        self.hint = hint
        text = f"{provider} {call}: {detail}"
        super().__init__(f"{text} ({hint})" if hint else text)


class NoCapacity(ProviderError):
    """The provider has no machine for the request right now; try another offer or later."""

    refused = True


class OfferGone(ProviderError):
    """The offer was taken or withdrawn between search and rent."""

    refused = True


class OutcomeUnknown(ProviderError):
    """A state-changing call failed in a way that may or may not have taken effect."""


class RentOutcomeUnknown(ProviderError):
    """A box may exist under the label: a create's outcome was unknown (a timeout, a dropped
    connection, a 5xx) and no lookup found its box, or the lookup failed. Whatever came after
    (even an offer gone, which the first create may have caused) says nothing about it. The
    rent is unfinished: look the label up again before renting anything else for it."""


class RateLimited(ProviderError):
    """The provider answered 429 and the retries ran out."""

    refused = True  # a 429 is answered instead of doing the call

    def __init__(self, provider: str, call: str, detail: str, retry_after: float | None = None):
        super().__init__(provider, call, detail, "slow down and try again")
        self.retry_after = retry_after


class AuthFailed(ProviderError):
    """The key was missing or refused: the operator's to fix, so exit status 2."""

    exit_code = 2
    refused = True
