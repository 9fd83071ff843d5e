"""The agent's one error type.

A user's mistake (bad config, bad argument) carries exit status 2 and is printed as one line
`error: ...`; anything else the agent refuses on purpose carries exit status 1.
"""

from __future__ import annotations

from agent.contract import EXIT_REFUSED, EXIT_USAGE


class AgentError(Exception):
    """An error the agent raises on purpose; `exit_code` is what the CLI exits with."""

    def __init__(self, message: str, exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def usage_error(message: str) -> AgentError:
    """A user's mistake: exit status 2."""
    return AgentError(message, exit_code=EXIT_USAGE)
