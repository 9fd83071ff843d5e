"""Converge the standing boxes: the standing deploy, then the testinfra checks against the
same inventory. One way for `fleet converge` (every standing box, its output on the terminal)
and the loop (the boxes it rented or found with a dead agent, bounded, one line back)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fleet.boxes import pyinfra_run
from fleet.core.errors import FleetError

if TYPE_CHECKING:
    from fleet.core.config import Config
from fleet.core.paths import CHECKS, SHIPPED

DEPLOY = "deploys/standing.py"
PEERS_DEPLOY = "deploys/peers.py"


def checks_argv() -> list[str]:
    """The testinfra checks of the boxes a deploy reached (`FLEET_INFRA_LIMIT` narrows them)."""
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CHECKS)]


def converge_all(cfg: Config, dry: bool = False) -> None:
    """`fleet converge standing`: the deploy over every standing box with its output shown,
    then the checks (none after a dry run, which shows what would change and changes
    nothing). A failure is a FleetError."""
    env = pyinfra_run.env(cfg, progress=True)  # a person watches this one
    # --dry shows the detected changes; with -y pyinfra would skip detecting them
    deploy = pyinfra_run.argv(DEPLOY, ["standing"], dry=dry)
    if subprocess.run(deploy, cwd=SHIPPED, env=env).returncode != 0:
        raise FleetError("the standing deploy failed (see pyinfra's output above)")
    if not dry and subprocess.run(checks_argv(), cwd=SHIPPED, env=env).returncode:
        raise FleetError("the testinfra checks failed after the deploy")


def converge(cfg: Config, labels: Sequence[str]) -> str | None:
    """The standing deploy on `labels`, then the testinfra checks on them; None when both
    passed, else what failed (one line). Each run is bounded by `converge_timeout_s`: a hung
    deploy must not stall the loop, whose other boxes still need their ticks."""
    env = pyinfra_run.env(cfg, FLEET_INFRA_LIMIT=",".join(labels))
    deploy = pyinfra_run.argv(DEPLOY, labels)
    r = _bounded(deploy, env, cfg.loop.converge_timeout_s)
    if isinstance(r, str):
        return f"the standing deploy {r}"
    if r.returncode != 0:
        return f"the standing deploy failed: {_last_line(r.stderr or r.stdout)}"
    r = _bounded(checks_argv(), env, cfg.loop.converge_timeout_s)
    if isinstance(r, str):
        return f"the testinfra checks {r}"
    if r.returncode != 0:
        failed = [ln for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        return f"the testinfra checks failed: {(failed or [_last_line(r.stdout)])[0]}"
    return None


def write_peers(cfg: Config, labels: Sequence[str]) -> str | None:
    """The peers deploy on `labels` (each box's peers file: the public p2p endpoints of the
    other standing boxes of its network); None when it passed, else what failed (one line),
    bounded like `converge`."""
    r = _bounded(pyinfra_run.argv(PEERS_DEPLOY, labels), pyinfra_run.env(cfg),
                 cfg.loop.converge_timeout_s)
    if isinstance(r, str):
        return f"the peers deploy {r}"
    if r.returncode != 0:
        return f"the peers deploy failed: {_last_line(r.stderr or r.stdout)}"
    return None


def _bounded(argv: list[str], env: dict[str, str],
             timeout_s: float) -> subprocess.CompletedProcess[str] | str:
    """Run `argv` in its own process group; past `timeout_s` the whole group (pyinfra's or
    pytest's SSH children too) is killed and the answer is a sentence, not a result."""
    p = subprocess.Popen(argv, cwd=SHIPPED, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return f"ran past {timeout_s:g} s and was killed"
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"
