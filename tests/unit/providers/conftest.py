"""Fixtures: each client wired to its in-memory fake (see provider_fakes)."""

from __future__ import annotations

import pytest
from provider_fakes import FakeRunPod, FakeVast, make_http

from fleet.providers.runpod import RunPod
from fleet.providers.vast import Vast


@pytest.fixture
def rp() -> tuple[RunPod, FakeRunPod]:
    fake = FakeRunPod()
    return RunPod(make_http("runpod", fake), destroy_polls=5, poll_interval=1.0), fake


@pytest.fixture
def vast() -> tuple[Vast, FakeVast]:
    fake = FakeVast()
    return Vast(make_http("vast", fake), destroy_polls=5, poll_interval=1.0), fake
