"""The one pyinfra runner: a run is a process group of its own, killed whole at its timeout and
reported per host; each host's result is read from the JSON the run writes, never from its
printed output (the real pyinfra CLI, @local)."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from repo_root import ROOT

from fleet.boxes import pyinfra_run
from fleet.boxes.pyinfra_run import Run
from fleet.core.config import Config, parse

CONFIG = {"fleet": {"registry": "state/boxes.json"},
          "roles": {"bench": {"kind": "oneshot", "image": "img", "disk_gb": 20,
                              "admitted_driver": "580.95.05"}}}

HANGS = textwrap.dedent("""
    from pyinfra import host
    from pyinfra.operations import server

    from fleet.boxes import deploy_results

    deploy_results.record_into(host.data.get("results_dir"))
    server.shell(name="Hangs", commands=["echo $$ > {pidfile}; exec sleep 600"])
""")

FAILS = textwrap.dedent("""
    from pyinfra import host
    from pyinfra.operations import server

    from fleet.boxes import deploy_results

    deploy_results.record_into(host.data.get("results_dir"))
    server.shell(name="Fails on purpose",
                 commands=["echo FAILED a line to grep; echo said-on-stderr >&2; exit 3"])
""")


@pytest.fixture
def local_deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`run_pyinfra` runs `deploy.py` in tmp_path over @local instead of the inventory."""
    deploy = tmp_path / "deploy.py"

    def argv(_deploy: str, labels: Sequence[str], data: Mapping[str, str] | None = None,
             fail_fast: bool = False, dry: bool = False) -> list[str]:
        out = [str(pyinfra_run.BIN / "pyinfra"), "-y", "@local", str(deploy)]
        for k, v in (data or {}).items():
            out += ["--data", f"{k}={v}"]
        return out

    monkeypatch.setattr(pyinfra_run, "argv", argv)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return deploy


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return parse(CONFIG, tmp_path / "fleet.toml")


def test_a_hung_run_is_killed_with_its_group_at_its_timeout_and_fails_each_host(
        cfg: Config, local_deploy: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "sleep.pid"
    local_deploy.write_text(HANGS.replace("{pidfile}", str(pidfile)))
    started = time.monotonic()
    run = pyinfra_run.run_pyinfra(cfg, ["@local"], deploy="deploy.py", timeout_s=20)
    assert time.monotonic() - started < 120
    assert run.timed_out == "ran past 20 s and was killed" and run.rc != 0
    assert run.errors_for("@local")[-1] == "pyinfra ran past 20 s and was killed"
    assert run.problem(["@local"]) == "ran past 20 s and was killed"
    # the command pyinfra started (its grandchild) went with the group
    assert pidfile.exists(), "the deploy never reached its hanging step"
    sleeper = int(pidfile.read_text())
    deadline = time.monotonic() + 30
    while _alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(sleeper)


def test_a_failed_host_is_read_from_the_runs_json_not_its_output(
        cfg: Config, local_deploy: Path) -> None:
    local_deploy.write_text(FAILS)
    run = pyinfra_run.run_pyinfra(cfg, ["@local"], deploy="deploy.py", timeout_s=300)
    assert run.rc != 0 and run.timed_out is None
    assert run.errors_for("@local") == ["Fails on purpose failed", "FAILED a line to grep",
                                        "said-on-stderr"]
    assert run.problem(["@local"]) == "failed: @local: said-on-stderr"
    # what pyinfra printed plays no part: the same words in the output alone say nothing
    printed = Run(1, "FAILED elsewhere\nsaid-on-stderr\n", {})
    assert printed.errors_for("elsewhere") == [
        "no result from the run: the box did not connect (see pyinfra's output)"]


def test_a_run_that_passed_has_no_problem_and_a_killed_one_names_its_timeout() -> None:
    assert Run(0, "FAILED is only a word here", {}).problem(["a"]) is None
    killed = Run(-9, "", {"a": {"staged": True}}, timed_out=pyinfra_run.killed(5))
    assert killed.errors_for("a") == ["pyinfra ran past 5 s and was killed"]
    assert killed.errors_for("b") == ["pyinfra ran past 5 s and was killed"]


def _forks_and_sleeps(pidfile: Path) -> list[str]:
    """A parent that forks a sleeping child (as pyinfra forks ssh), then sleeps itself."""
    return [sys.executable, "-c",
            "import subprocess, time\n"
            "c = subprocess.Popen(['sleep', '600'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
            "time.sleep(600)"]


def test_a_run_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    got = pyinfra_run.bounded(_forks_and_sleeps(pidfile), dict(os.environ), 10)
    assert got == "ran past 10 s and was killed"
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)
    done = pyinfra_run.bounded([sys.executable, "-c", "print('ok')"], dict(os.environ), 60)
    assert not isinstance(done, str) and done.returncode == 0 and done.stdout == "ok\n"


def test_a_run_streamed_line_by_line_is_killed_with_its_group_too(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    argv = _forks_and_sleeps(pidfile)
    lines: list[str] = []
    got = pyinfra_run.bounded(argv, dict(os.environ), 10, on_line=lines.append)
    assert got == "ran past 10 s and was killed" and lines == []
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pidfile.read_text())
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_box_the_standing_deploy_refuses_fails_in_its_results(
        cfg: Config, local_deploy: Path) -> None:
    standing = ROOT / "deploys" / "standing.py"
    local_deploy.write_text(standing.read_text())  # @local is no standing box
    run = pyinfra_run.run_pyinfra(cfg, ["@local"], deploy="deploy.py", timeout_s=300)
    assert run.rc != 0 and run.timed_out is None
    assert run.errors_for("@local")[0] == "Standing box | Refuse one-shot box failed"
    assert run.problem(["@local"]) == "failed: @local: Standing box | Refuse one-shot box failed"
