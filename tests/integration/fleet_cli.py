"""What the sandbox integration tests share: the fleet.toml they start from, a bounded poll,
and the real `fleet` and `pyinfra` CLIs run as subprocesses against one sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox import fleet_toml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def config(state: Path) -> str:
    """Four standing boxes wanted (two per provider) and the one-shot `bench` role."""
    return fleet_toml.render(state, roles=fleet_toml.LIVE_ROLE + fleet_toml.BENCH_ROLE,
                             roster=fleet_toml.ROSTER_4090)


def workspace(factory: pytest.TempPathFactory, name: str, toml: Callable[[Path], str],
              columns: int = 250, **extra: str) -> tuple[Path, dict[str, str]]:
    """A fresh folder with its fleet.toml (`toml` of its state folder, `<folder>/state`), and
    the environment that points the fleet commands at it and at a sandbox of its own
    (`<folder>/sandbox`). Sandbox boxes are namespaces: root only."""
    if os.geteuid() != 0:
        raise RuntimeError("sandbox boxes need root (namespaces); run the tests as root")
    tmp = factory.mktemp(name)
    (tmp / "fleet.toml").write_text(toml(tmp / "state"))
    env = {**os.environ, "FLEET_CONFIG": str(tmp / "fleet.toml"),
           "FLEET_SANDBOX_DIR": str(tmp / "sandbox"), "COLUMNS": str(columns),
           "PYINFRA_PROGRESS": "off", **extra}
    return tmp, env


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90.0,
             poll_s: float = 0.3) -> Any:
    """Poll until check() is truthy and return it; fail naming `what` and the last answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as e:  # a box mid-restart refuses SSH for a moment
            last = e
        else:
            if last:
                return last
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class FleetCli:
    """The operator's commands, run from the repository with the sandbox's environment."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = env

    def run(self, *argv: str, check: bool = True, timeout: float = 900
            ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(list(argv), cwd=REPO, env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{argv} failed ({r.returncode}):\n{r.stdout[-3000:]}\n"
                                 f"{r.stderr[-3000:]}")
        return r

    def fleet(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(str(BIN / "fleet"), *args, check=check)
