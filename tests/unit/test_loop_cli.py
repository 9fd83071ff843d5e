"""`fleet loop`'s bad input and its lock: one line, exit 2, nothing asked of any provider."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import CONFIG, fleet

from fleet.loop import LoopLock


@pytest.mark.parametrize(("args", "extra", "message"), [
    (["--interval", "-5"], "", "error: --interval must be a positive number of seconds"),
    (["--interval", "0"], "", "error: --interval must be a positive number of seconds"),
    ([], "[[roster.ghost]]\nprovider = \"vast\"\ncard = \"RTX 4090\"\n",
     "roster.ghost: unknown role 'ghost'"),
    ([], "[loop]\ninterval_s = -1\n", "loop: interval_s and converge_timeout_s must be positive"),
    ([], "[loop]\nconverge_timeout_s = 0\n",
     "loop: interval_s and converge_timeout_s must be positive"),
    ([], "[loop]\ncolour = 1\n", "loop: unknown key 'colour'"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], extra: str,
                                      message: str) -> None:
    r = fleet(tmp_path, "loop", "--once", *args, config=CONFIG + extra)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "state" / "loop.json").exists()


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
