"""Fixtures the operations' tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_sandbox import FleetRun, fleet_run

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


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> Iterator[FleetRun]:
    """A sandbox of its own with boxes (sandbox.Sandbox), and the fleet CLI pointed at it."""
    with fleet_run(tmp_path, monkeypatch, capsys) as f:
        yield f
