"""`pytest tests/sim` runs the CI's seeds; `--seed N` (repeatable) replays those alone, and
`--seeds N` runs N seeds from 0 (`bench/sim_soak.py` runs many more)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the simulation's own modules, by name

CI_SEEDS = 500


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--seed", type=int, action="append", default=None,
                     help="replay these seeds only (repeatable)")
    parser.addoption("--seeds", type=int, default=CI_SEEDS, help="how many seeds from 0")


@pytest.fixture
def seeds(request: pytest.FixtureRequest) -> list[int]:
    chosen = request.config.getoption("--seed")
    return list(chosen) if chosen else list(range(request.config.getoption("--seeds")))
