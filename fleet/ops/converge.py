"""Converge the standing boxes: the standing deploy, then the testinfra checks against the
same inventory. One way for `fleet converge` (every standing box, its output on the terminal)
and the loop (the boxes it rented or found with a dead agent, one line back, pyinfra's output
at debug level). The loop's runs are bounded by `converge_timeout_s` (`pyinfra_run.bounded`):
a hung deploy must not stall the loop, whose other boxes still need their ticks."""

from __future__ import annotations

import logging
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.boxes import pyinfra_run
from fleet.core.errors import FleetError

if TYPE_CHECKING:
    from fleet.core.config import Config
from fleet.core.paths import CHECKS

DEPLOY = "deploys/standing.py"
PEERS_DEPLOY = "deploys/peers.py"


def checks_argv(report: str | Path | None = None) -> list[str]:
    """The testinfra checks of the boxes a deploy reached (`FLEET_INFRA_LIMIT` narrows them);
    `report`: their results as JUnit XML there too."""
    out = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CHECKS)]
    return out + ([f"--junitxml={report}"] if report else [])


def converge_all(cfg: Config, dry: bool = False) -> None:
    """`fleet converge standing`: the deploy over every standing box with its output shown,
    then the checks (none after a dry run, which shows what would change and changes
    nothing). A failure is a FleetError."""
    # no limit: a person watches this one (^C stops it), over every standing box at once,
    # whose uploads take what the uplink allows
    timeout_s = None
    # --dry shows the detected changes; with -y pyinfra would skip detecting them
    run = pyinfra_run.run_pyinfra(cfg, ["standing"], fail_fast=False, deploy=DEPLOY,
                                  timeout_s=timeout_s, dry=dry, show=True)
    if run.timed_out:
        raise FleetError(f"the standing deploy {run.timed_out}")
    if run.rc != 0:
        raise FleetError("the standing deploy failed (see pyinfra's output above)")
    if dry:
        return
    r = pyinfra_run.bounded(checks_argv(), pyinfra_run.env(cfg, progress=True), timeout_s,
                            show=True)
    if isinstance(r, str):
        raise FleetError(f"the testinfra checks {r}")
    if r.returncode:
        raise FleetError("the testinfra checks failed after the deploy")


def converge(cfg: Config, labels: Sequence[str]) -> str | None:
    """The standing deploy on `labels`, then the testinfra checks on them; None when both
    passed, else what failed (one line)."""
    timeout_s = cfg.loop.converge_timeout_s
    run = pyinfra_run.run_pyinfra(cfg, labels, fail_fast=False, deploy=DEPLOY,
                                  timeout_s=timeout_s, level=logging.DEBUG,
                                  FLEET_INFRA_LIMIT=",".join(labels))
    problem = run.problem(labels)
    if problem:
        return f"the standing deploy {problem}"
    return _checks(cfg, labels, timeout_s)


def _checks(cfg: Config, labels: Sequence[str], timeout_s: float) -> str | None:
    """The testinfra checks on `labels`: None when they passed, else the first that failed,
    read from their JUnit report."""
    with tempfile.TemporaryDirectory(prefix="fleet-checks-") as tmp:
        report = Path(tmp) / "checks.xml"
        r = pyinfra_run.bounded(checks_argv(report), pyinfra_run.env(
            cfg, FLEET_INFRA_LIMIT=",".join(labels)), timeout_s)
        if isinstance(r, str):
            return f"the testinfra checks {r}"
        if r.returncode == 0:
            return None
        failed = _failed_checks(report)
    return f"the testinfra checks failed: {(failed or [f'exit {r.returncode}'])[0]}"


def _failed_checks(report: Path) -> list[str]:
    """Each failed or erring check in a JUnit report, as `name: message` (first line)."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in root.iter("testcase"):
        for bad in (*case.findall("failure"), *case.findall("error")):
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            out.append(f"{case.get('name')}: {message[0] if message else bad.tag}"[:300])
    return out


def write_peers(cfg: Config, labels: Sequence[str]) -> str | None:
    """The peers deploy on `labels` (each box's peers file: the public p2p endpoints of the
    other standing boxes of its network); None when it passed, else what failed (one line),
    bounded like `converge`."""
    run = pyinfra_run.run_pyinfra(cfg, labels, fail_fast=False, deploy=PEERS_DEPLOY,
                                  timeout_s=cfg.loop.converge_timeout_s, level=logging.DEBUG)
    problem = run.problem(labels)
    return f"the peers deploy {problem}" if problem else None
