"""Fixtures for the agent's tests (helpers live in agentbox.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agentbox import Box

from sandbox.amdsmi import build_libraries
from sandbox.nvml import build_library


@pytest.fixture(scope="session")
def nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("nvml")).parent


@pytest.fixture(scope="session")
def rocm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ROCm install's root: the stand-in libamd_smi.so and librocm-core.so in lib/."""
    root = tmp_path_factory.mktemp("rocm")
    build_libraries(root / "lib")
    return root


@pytest.fixture
def box(tmp_path: Path, nvml_dir: Path) -> Iterator[Box]:
    b = Box(tmp_path, nvml_dir)
    try:
        yield b
    finally:
        b.cleanup()
