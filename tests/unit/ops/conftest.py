"""Fixtures the operations' tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.daemon import Sandbox
from sandbox.frozen import frozen_sandbox


@pytest.fixture
def sbx(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    """The sandbox's fake provider APIs in this process, on loopback (no boxes), with a
    market of 64 machines a provider, the environment pointing the clients at them: one
    per test."""
    with frozen_sandbox(seed=0, machines_per_provider=64) as s:
        for k, v in s.env().items():
            monkeypatch.setenv(k, v)
        yield s
