"""Fixtures for the simulator tests: a built release store and a process keeper."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sim_helpers import Procs

from sandbox.releases import Release, build_store, latest


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> list[Release]:
    return build_store(tmp_path_factory.mktemp("releases"))


@pytest.fixture
def release(store: list[Release]) -> Release:
    return latest(store)


@pytest.fixture
def procs(release: Release, tmp_path: Path) -> Iterator[Procs]:
    p = Procs(release, tmp_path)
    try:
        yield p
    finally:
        p.close()
        for _, log in p.started:  # shown by pytest when the test failed
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
