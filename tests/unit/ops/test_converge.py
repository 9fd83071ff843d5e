"""The loop's converge and peers runs say what failed in one line, read from what the runs
wrote (each host's JSON, the checks' JUnit report), never from their printed output."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleet.boxes import pyinfra_run
from fleet.boxes.pyinfra_run import Run
from fleet.core.config import Config, parse
from fleet.ops import converge

CONFIG = {"fleet": {"registry": "state/boxes.json"},
          "roles": {"live": {"kind": "standing", "image": "img", "disk_gb": 20,
                             "admitted_driver": "580.95.05"}}}
PRINTED = "FAILED tests/infra/test_box.py::test_nothing - printed, never read\n"
REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" tests="2">
<testcase classname="test_box" name="test_agent_runs[ssh://box-a]" time="0.1"/>
<testcase classname="test_box" name="test_agent_runs[ssh://box-b]" time="0.1">
<failure message="AssertionError: agent.pid is missing&#10;assert False">trace</failure>
</testcase></testsuite></testsuites>
"""


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return parse(CONFIG, tmp_path / "fleet.toml")


def _deploy(monkeypatch: pytest.MonkeyPatch, run: Run) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def fake(cfg: Config, labels: Sequence[str], data: Mapping[str, str] | None = None,
             **kw: Any) -> Run:
        calls.append({"labels": list(labels), **kw})
        return run

    monkeypatch.setattr(pyinfra_run, "run_pyinfra", fake)
    return calls


def _checks(monkeypatch: pytest.MonkeyPatch, rc: int, report: str | None) -> None:
    def fake(argv: Sequence[str], env: Mapping[str, str], timeout_s: float | None,
             **kw: Any) -> subprocess.CompletedProcess[str]:
        (path,) = [a.split("=", 1)[1] for a in argv if a.startswith("--junitxml=")]
        if report is not None:
            Path(path).write_text(report)
        return subprocess.CompletedProcess(list(argv), rc, PRINTED, "")

    monkeypatch.setattr(pyinfra_run, "bounded", fake)


def test_a_failed_deploy_names_the_box_and_what_its_step_said(
        cfg: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _deploy(monkeypatch, Run(1, PRINTED, {"box-b": {"errors": [
        {"step": "Agent running", "stdout": [], "stderr": ["agent did not start"]}]}}))
    got = converge.converge(cfg, ["box-a", "box-b"])
    assert got == "the standing deploy failed: box-b: agent did not start"
    assert calls[0]["deploy"] == converge.DEPLOY and calls[0]["timeout_s"] == 1800.0


def test_a_deploy_past_its_timeout_is_one_line(cfg: Config,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _deploy(monkeypatch, Run(-9, "", {}, timed_out=pyinfra_run.killed(1800)))
    assert converge.converge(cfg, ["box-a"]) == \
        "the standing deploy ran past 1800 s and was killed"
    assert converge.write_peers(cfg, ["box-a"]) == \
        "the peers deploy ran past 1800 s and was killed"


def test_a_failed_check_is_read_from_the_checks_report(
        cfg: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    _deploy(monkeypatch, Run(0, PRINTED, {}))
    _checks(monkeypatch, 1, REPORT)
    assert converge.converge(cfg, ["box-a", "box-b"]) == (
        "the testinfra checks failed: test_agent_runs[ssh://box-b]: AssertionError: "
        "agent.pid is missing")


def test_checks_that_failed_without_a_report_say_their_exit_status(
        cfg: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    _deploy(monkeypatch, Run(0, PRINTED, {}))
    _checks(monkeypatch, 4, None)
    assert converge.converge(cfg, ["box-a"]) == "the testinfra checks failed: exit 4"
    _checks(monkeypatch, 0, None)
    assert converge.converge(cfg, ["box-a"]) is None
    assert converge.write_peers(cfg, ["box-a"]) is None
