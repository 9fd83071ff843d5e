"""The one error type of `sandbox.boxes`."""

from __future__ import annotations


class BoxError(RuntimeError):
    """A box could not be started, changed or removed; the message says which and why."""
