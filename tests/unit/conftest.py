"""Fixtures shared by the unit tests of the operator's side."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.daemon import Sandbox
from sandbox.frozen import frozen_sandbox


@pytest.fixture
def sbx(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    """The sandbox's fake provider APIs in this process, on loopback (no boxes), with a
    market of 64 machines a provider, and the environment pointing the clients at them. A
    test module (or folder) that wants another market defines its own `sbx`."""
    with frozen_sandbox(seed=0, machines_per_provider=64) as s:
        for k, v in s.env().items():
            monkeypatch.setenv(k, v)
        yield s
