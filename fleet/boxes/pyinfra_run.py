"""pyinfra runs from the operator's own commands (publish, one-shot jobs, the loop): the argv
over exactly some boxes, and the environment that points pyinfra, and the testinfra checks
run beside it, at this fleet.toml."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.boxes import deploy_results
from fleet.core.paths import INVENTORY, SHIPPED

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fleet.core.config import Config

BIN = Path(sys.executable).parent


def env(cfg: Config, progress: bool = False, **extra: str) -> dict[str, str]:
    """This process's environment with the config, the venv's tools first, and pyinfra's
    progress display off unless a person watches (`progress`)."""
    out = {**os.environ, "FLEET_CONFIG": str(cfg.path),
           "FLEET_INVENTORY": str(INVENTORY),  # what the testinfra checks read
           "PATH": f"{BIN}:{os.environ.get('PATH', '')}", **extra}
    if not progress:
        out["PYINFRA_PROGRESS"] = "off"
    return out


def argv(deploy: str, labels: Sequence[str], data: Mapping[str, str] | None = None,
         fail_fast: bool = False, dry: bool = False) -> list[str]:
    """`pyinfra -y` of `deploy` ("deploys/standing.py", found in what fleet ships) over the
    fleet's inventory, limited to `labels` (host names or groups); `fail_fast` stops at the
    first failed box (`--fail-percent 0`); `dry` only shows what would change."""
    out = [str(BIN / "pyinfra"), "--dry" if dry else "-y"]
    if fail_fast:
        out += ["--fail-percent", "0"]
    for label in labels:
        out += ["--limit", label]
    out += [str(INVENTORY), str(SHIPPED / deploy)]
    for k, v in (data or {}).items():
        out += ["--data", f"{k}={v}"]
    return out


@dataclass
class Run:
    rc: int
    output: str
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # by host, from JSON

    def errors_for(self, label: str) -> list[str]:
        """What went wrong on one host, as the run recorded it, most telling last: each failed
        step, what it printed (an agent's JSON answer as its outcome and reason), its errors.
        A host with no result at all never got as far as its deploy (it did not connect); that
        holds for a deploy that records its results (`deploy_results.record_into`: publish's)."""
        if label not in self.results:
            return ["no result from the run: the box did not connect (see pyinfra's output)"]
        out = []
        for error in self.results[label].get("errors", []):
            out.append(f"{error.get('step')} failed")
            out.extend(_said(error.get("stdout") or []))
            out.extend(str(line) for line in error.get("stderr") or [])
        return out


def _said(stdout: list[str]) -> list[str]:
    """What a failed command printed: an agent's JSON answer as its outcome and reason, other
    output as its last lines."""
    try:
        answer = json.loads("\n".join(stdout))
    except ValueError:
        return [str(line) for line in stdout[-5:]]
    if not isinstance(answer, dict):
        return [str(line) for line in stdout[-5:]]
    return [f"{k}: {answer[k]}" for k in ("outcome", "reason") if answer.get(k) is not None]


def run_pyinfra(cfg: Config, labels: Sequence[str], data: Mapping[str, str],
                fail_fast: bool = True,
                deploy: str = "deploys/publish.py") -> Run:
    """One pyinfra run of `deploy` over exactly `labels` (a publish's waves are ours), its
    output logged line by line (this module's logger: `fleet run` shows it with -v).

    `fail_fast` (a wave): `--fail-percent 0`, the run stops at the first failed box. Staging
    runs without it, so every box gets through or names its own failure.
    """
    with tempfile.TemporaryDirectory(prefix="fleet-pyinfra-") as results:
        into = Path(results)
        proc = subprocess.Popen(argv(deploy, labels, {**data, "results_dir": results},
                                     fail_fast), cwd=SHIPPED, env=env(cfg),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            log.info("%s", line.rstrip("\n"))
        return Run(proc.wait(), "".join(lines), deploy_results.read(into))
