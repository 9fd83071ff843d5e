"""Fixtures the unit tests of more than one folder share (a folder's own are in its
conftest.py; helpers any test imports by bare name are the modules beside this one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_client import hub_server

from sandbox.amdsmi import build_libraries
from sandbox.hub import HubServer
from sandbox.nvml import build_library


@pytest.fixture(scope="session")
def nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the sandbox's stand-in libnvidia-ml.so.1."""
    return build_library(tmp_path_factory.mktemp("nvml")).parent


@pytest.fixture(scope="session")
def rocm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ROCm install's root, as on an AMD box: the stand-in libamd_smi.so and
    librocm-core.so in lib/."""
    root = tmp_path_factory.mktemp("rocm")
    build_libraries(root / "lib")
    return root


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """The sandbox's Hub server under tmp_path, the Hub client pointed at it."""
    yield from hub_server(tmp_path, monkeypatch)
