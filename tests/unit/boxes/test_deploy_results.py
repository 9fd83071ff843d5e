"""A pyinfra run's per-host results come back as JSON written by the run itself: the step that
failed and its last lines, beside what the deploy marked (the real pyinfra CLI, @local)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fleet.boxes import deploy_results
from fleet.boxes.pyinfra_run import Run

DEPLOY = textwrap.dedent("""
    from pyinfra import host
    from pyinfra.operations import python, server

    from fleet.boxes import deploy_results

    deploy_results.record_into(host.data.get("results_dir"))
    python.call(name="Marked", function=deploy_results.mark,
                results_dir=host.data.get("results_dir"), host=host.name, staged=True)
    server.shell(name="Fails on purpose", commands=["echo said-on-stdout; "
                                                    "echo said-on-stderr >&2; exit 3"])
    server.shell(name="Never reached", commands=["true"])
""")


def test_a_failed_step_and_its_output_come_back_per_host(tmp_path: Path) -> None:
    (tmp_path / "deploy.py").write_text(DEPLOY)
    into = tmp_path / "results"
    into.mkdir()
    pyinfra = Path(sys.executable).parent / "pyinfra"
    r = subprocess.run([str(pyinfra), "-y", "@local", "deploy.py", "--data",
                        f"results_dir={into}"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYINFRA_PROGRESS": "off"})
    assert r.returncode != 0, r.stdout + r.stderr
    got = deploy_results.read(into)
    assert list(got) == ["@local"], got
    assert got["@local"]["staged"] is True
    (error,) = got["@local"]["errors"]
    assert error["step"] == "Fails on purpose"
    assert error["stdout"] == ["said-on-stdout"] and error["stderr"] == ["said-on-stderr"]
    assert Run(r.returncode, "", got).errors_for("@local") == [
        "Fails on purpose failed", "said-on-stdout", "said-on-stderr"]
    assert Run(r.returncode, "", got).errors_for("elsewhere") == [
        "no result from the run: the box did not connect (see pyinfra's output)"]


def test_an_agents_json_answer_reads_as_its_outcome_and_reason() -> None:
    answer = ['{', ' "outcome": "reverted",', ' "reason": "not synced within 300 s",',
              ' "target": {', '  "sha16": "ce417bb64b68f0b8"', ' }', '}']
    run = Run(1, "", {"box": {"errors": [{"step": "Switch to 1.5.0", "stdout": answer,
                                          "stderr": []}]}})
    assert run.errors_for("box") == ["Switch to 1.5.0 failed", "outcome: reverted",
                                     "reason: not synced within 300 s"]


def test_a_run_without_a_results_folder_records_nothing(tmp_path: Path) -> None:
    deploy_results.record_into(None)
    assert deploy_results.read(tmp_path) == {}
