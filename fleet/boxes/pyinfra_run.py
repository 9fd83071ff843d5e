"""pyinfra runs from the operator's own commands (converge, publish, one-shot jobs, the
loop): one way to run them (`run_pyinfra`), over exactly some boxes, with the environment that
points pyinfra, and the testinfra checks run beside it, at this fleet.toml.

Every run is a process group of its own (pyinfra's SSH children in it), killed whole when it
runs past its time (`bounded`): a hung box fails the run, it never hangs the operator. What
each box did comes back as JSON the run writes per host (`fleet.boxes.deploy_results`), never
as words picked out of pyinfra's printed output."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.boxes import deploy_results
from fleet.core.paths import INVENTORY, SHIPPED

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fleet.core.config import Config

BIN = Path(sys.executable).parent
READER_GRACE_S = 10.0  # for the last lines once the run has ended


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


def killed(timeout_s: float) -> str:
    """What a run past its time is told as (the whole process group was killed)."""
    return f"ran past {timeout_s:g} s and was killed"


def bounded(argv: Sequence[str], env: Mapping[str, str], timeout_s: float | None,
            on_line: Callable[[str], None] | None = None,
            show: bool = False) -> subprocess.CompletedProcess[str] | str:
    """Run `argv` in its own process group; past `timeout_s` (None: no limit) the whole group
    (pyinfra's or pytest's SSH children too) is killed and the answer is a sentence
    (`killed`), not a result. `on_line` gets each line as it comes (stderr merged into stdout);
    `show` leaves both on this process's terminal (a person watches). An interrupt here (^C)
    kills the group too: in a session of its own the child would not see it."""
    pipe = None if show else subprocess.PIPE
    p = subprocess.Popen(list(argv), cwd=SHIPPED, env=dict(env), stdout=pipe,
                         stderr=subprocess.STDOUT if on_line and not show else pipe, text=True,
                         start_new_session=True)
    lines: list[str] = []
    reader = None
    if on_line is not None and p.stdout is not None:
        reader = threading.Thread(target=_read_lines, args=(p.stdout, lines, on_line),
                                  daemon=True)
        reader.start()
    try:
        if reader is None:
            out, err = p.communicate(timeout=timeout_s)
        else:
            p.wait(timeout=timeout_s)
            reader.join(READER_GRACE_S)  # a child that left the group may hold the pipe
            out, err = "".join(lines), ""
    except subprocess.TimeoutExpired:
        _kill_group(p, reader)
        return killed(timeout_s or 0)
    except BaseException:
        _kill_group(p, reader)
        raise
    return subprocess.CompletedProcess(list(argv), p.returncode, out or "", err or "")


def _read_lines(stream: Any, into: list[str], on_line: Callable[[str], None]) -> None:
    for line in stream:
        into.append(line)
        on_line(line.rstrip("\n"))


def _kill_group(p: subprocess.Popen[str], reader: threading.Thread | None) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    if reader is None:
        p.communicate()
    else:  # the reader owns the pipe
        p.wait()
        reader.join(READER_GRACE_S)


@dataclass
class Run:
    rc: int
    output: str
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # by host, from JSON
    timed_out: str | None = None  # `killed`'s sentence when the run ran past its time

    def errors_for(self, label: str) -> list[str]:
        """What went wrong on one host, as the run recorded it, most telling last: each failed
        step, what it printed (an agent's JSON answer as its outcome and reason), its errors,
        and a run killed at its timeout. A host with no result at all never got as far as its
        deploy (it did not connect); that holds for a deploy that records its results
        (`deploy_results.record_into`: publish's)."""
        killed_run = [f"pyinfra {self.timed_out}"] if self.timed_out else []
        if label not in self.results:
            return killed_run or [
                "no result from the run: the box did not connect (see pyinfra's output)"]
        out = []
        for error in self.results[label].get("errors", []):
            out.append(f"{error.get('step')} failed")
            out.extend(_said(error.get("stdout") or []))
            out.extend(str(line) for line in error.get("stderr") or [])
        return out + killed_run

    def problem(self, labels: Sequence[str]) -> str | None:
        """None when the run passed, else what failed in one line: the timeout, else the last
        error of each host that recorded one, else of every host (a deploy that marks no
        success leaves a host that passed without a result too)."""
        if self.timed_out:
            return self.timed_out
        if self.rc == 0:
            return None
        failed = [label for label in labels if self.results.get(label, {}).get("errors")]
        said = [f"{label}: {errors[-1]}" for label in failed or labels
                if (errors := self.errors_for(label))]
        return f"failed: {'; '.join(said) or f'exit {self.rc}'}"[:300]


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


def run_pyinfra(cfg: Config, labels: Sequence[str], data: Mapping[str, str] | None = None,
                fail_fast: bool = True, deploy: str = "deploys/publish.py",
                timeout_s: float | None = None, dry: bool = False, show: bool = False,
                level: int = logging.INFO, **extra_env: str) -> Run:
    """One pyinfra run of `deploy` over exactly `labels` (a publish's waves are ours), each
    host's result read back from the JSON the run writes (`Run.results`).

    `fail_fast` (a wave): `--fail-percent 0`, the run stops at the first failed box. Staging
    runs without it, so every box gets through or names its own failure. `timeout_s`: past it
    the run's whole process group is killed (`Run.timed_out`), every host's failure. Its output
    is logged line by line at `level` (this module's logger: `fleet run` shows it with -v),
    or with `show` left on the terminal with pyinfra's progress display (a person watches);
    `extra_env` is added to its environment.
    """
    with tempfile.TemporaryDirectory(prefix="fleet-pyinfra-") as results:
        argv_ = argv(deploy, labels, {**(data or {}), "results_dir": results}, fail_fast, dry)
        r = bounded(argv_, env(cfg, progress=show, **extra_env), timeout_s,
                    on_line=None if show else functools.partial(log.log, level, "%s"),
                    show=show)
        found = deploy_results.read(Path(results))
    if isinstance(r, str):
        return Run(-signal.SIGKILL, "", found, timed_out=r)
    return Run(r.returncode, r.stdout, found)
