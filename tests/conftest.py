"""The order the suite's modules start in: the longest first (each builds and settles a
sandbox fleet of its own), so that with `./run.sh test`'s parallel workers no long module
starts last while the others idle. Only the order changes; every module stands alone."""

from __future__ import annotations

import pytest

pytest_plugins = ["pgserver"]  # a real PostgreSQL server: pg_server, pg_url, FLEET_TEST_BACKEND

# the longest modules, longest first (bench/RESULTS.md, "The suite's wall time", has their
# times); the rest follow in their usual order
LONGEST_FIRST = (
    "tests/integration/test_loop_faults_sandbox.py",
    "tests/integration/test_loop_sandbox.py",
    "tests/integration/test_loop_guards_sandbox.py",
    "tests/integration/test_standing.py",
    "tests/integration/test_spread_sandbox.py",
    "tests/sim/test_sim.py",  # its 500 seeds keep a core busy while the others wait on boxes
    "tests/integration/test_publish.py",
    "tests/integration/test_oneshot.py",
    "tests/integration/test_storage_sandbox.py",
    "tests/integration/test_oneshot_guards_sandbox.py",
    "tests/integration/test_mesh_sandbox.py",
    "tests/integration/test_ports_sandbox.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.nodeid.split("::", 1)[0], len(rank)),
                                 order[id(item)]))
