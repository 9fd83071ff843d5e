"""Fixtures for the agent's tests (helpers live in agentbox.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agentbox import Box


@pytest.fixture
def box(tmp_path: Path, nvml_dir: Path) -> Iterator[Box]:
    b = Box(tmp_path, nvml_dir)
    try:
        yield b
    finally:
        b.cleanup()
