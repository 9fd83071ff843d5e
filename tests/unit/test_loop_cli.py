"""`fleet loop`'s bad input and its lock: one line, exit 2, nothing asked of any provider."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import CONFIG, fleet

from fleet.ops.loop import LoopLock


@pytest.mark.parametrize(("args", "extra", "message"), [
    (["--interval", "-5"], "", "error: --interval must be a positive number of seconds"),
    (["--interval", "0"], "", "error: --interval must be a positive number of seconds"),
    ([], "[[roster.ghost]]\nprovider = \"vast\"\ncard = \"RTX 4090\"\n",
     "roster.ghost: unknown role 'ghost'"),
    (["--interval", "nan"], "", "error: --interval must be a positive number of seconds"),
    (["--interval", "inf"], "", "error: --interval must be a positive number of seconds"),
    # the orphan grace (default 600 s) is at least two intervals, overridden or not
    (["--interval", "301"], "", "error: --interval 301 leaves [loop] orphan_grace_s (600) "
     "under two intervals"),
    (["--interval", "20"], "[loop]\ninterval_s = 10\norphan_grace_s = 30\n",
     "error: --interval 20 leaves [loop] orphan_grace_s (30) under two intervals"),
    ([], "[loop]\ninterval_s = -1\n", "loop.interval_s: must be positive"),
    ([], "[loop]\nconverge_timeout_s = 0\n", "loop.converge_timeout_s: must be positive"),
    ([], "[loop]\ninterval_s = nan\n", "loop.interval_s: must be a finite number"),
    ([], "[loop]\norphan_grace_s = nan\n", "loop.orphan_grace_s: must be a finite number"),
    ([], "[loop]\ninterval_s = 10\norphan_grace_s = 5\n",
     "loop.orphan_grace_s: must be at least two interval_s"),
    ([], "[loop]\ncolour = 1\n", "loop: unknown key 'colour'"),
    # a duration too long to sleep or to mean anything: refused before the loop starts
    ([], "[loop]\ninterval_s = 1e10\norphan_grace_s = 2e10\n", "loop.interval_s: at most"),
    (["--interval", "1e10"], "[loop]\norphan_grace_s = 86400\n",
     "error: --interval must be a positive number of seconds, at most 3600"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], extra: str,
                                      message: str) -> None:
    r = fleet(tmp_path, "loop", "--once", *args, config=CONFIG + extra)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "state" / "loop.json").exists()
    assert not (tmp_path / "state" / "page").exists()  # nothing changed


def test_an_interval_of_half_the_orphan_grace_is_taken(tmp_path: Path) -> None:
    r = fleet(tmp_path, "loop", "--once", "--interval", "300")  # the default grace: 600 s
    assert r.returncode == 2 and "RUNPOD_API_KEY" in r.stderr, r.stderr  # past the checks


def test_a_page_directory_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    (tmp_path / "blocked").write_text("a file in the way\n")
    r = fleet(tmp_path, "loop", "--once", "--page", str(tmp_path / "blocked"))
    assert r.returncode == 2 and "a file is in the way" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_second_loop_on_the_same_registry_refuses_to_start(tmp_path: Path) -> None:
    registry = tmp_path / "state" / "boxes.json"
    with LoopLock(registry):  # the first loop
        r = fleet(tmp_path, "loop", "--once")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "another fleet loop runs on" in r.stderr and "not starting a second" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    with LoopLock(registry):  # released when the first one ends
        pass
