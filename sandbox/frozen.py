"""A sandbox whose clock stands still until the caller moves it (`World.advance`): for tests
that reason about money and time to the second without waiting for either."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sandbox.daemon import Sandbox

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, where a frozen world starts


class FrozenClock:
    """Time stands still unless the test (or World.advance) moves it."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@contextmanager
def frozen_sandbox(seed: int, **kw: Any) -> Iterator[Sandbox]:
    """A Sandbox (APIs on loopback, no ticker) on a FrozenClock at T0, closed afterwards."""
    s = Sandbox(seed=seed, ticker=False, clock=FrozenClock(), poll_interval=0.01, **kw)
    try:
        yield s
    finally:
        s.close()
