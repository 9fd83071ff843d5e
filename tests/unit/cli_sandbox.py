"""The `fleet` CLI run in-process against the sandbox's fake provider APIs (real HTTP servers on
loopback), for tests of commands that talk to providers.

`FleetRun` points the environment at a `Sandbox` the way `.sandbox/env` does, writes a
fleet.toml into the test's folder, and runs `fleet.cli.main.main()` with fresh CLI state. The
provider clients are the real ones; only their retry and destroy-wait pacing is made quick.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from state_fixture import dump

from fleet.cli import common
from fleet.cli import main as cli
from fleet.core.boxes import Row
from fleet.core.errors import NoCapacity, OfferGone
from fleet.providers.base import Box, Provider, RentRequest
from fleet.providers.factory import all_providers, get_provider
from fleet.providers.http import RetryPolicy
from fleet.state.registry import Registry
from sandbox.daemon import Sandbox

CONFIG = """
[fleet]
daily_budget_usd = {budget}
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
[roles.bench]
kind = "oneshot"
image = "img"
disk_gb = 20
admitted_driver = "580.95.05"
"""

# quick pacing for the real clients: two tries, short backoff, destroy polled every 50 ms
FAST = dict(retry=RetryPolicy(attempts=2, base_delay=0.02, max_delay=0.05), destroy_polls=200,
            poll_interval=0.05)


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


class FleetRun:
    def __init__(self, tmp_path: Path, sbx: Sandbox, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
        self.tmp_path, self.sbx, self.mp, self.capsys = tmp_path, sbx, monkeypatch, capsys
        for k, v in sbx.env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("HOME", str(tmp_path))  # no provider key files
        monkeypatch.setenv("COLUMNS", "200")
        monkeypatch.setattr(common, "providers", lambda: dict(all_providers(**FAST)))
        self.config(budget=100)

    def config(self, budget: float) -> None:
        cfg = self.tmp_path / "fleet.toml"
        cfg.write_text(CONFIG.format(budget=budget))
        self.mp.setenv("FLEET_CONFIG", str(cfg))

    @property
    def reg(self) -> Registry:
        return Registry(self.tmp_path / "state" / "boxes.json")

    def registry_bytes(self) -> str:
        """The whole state database, to compare: equal means nothing was written."""
        return dump(self.tmp_path / "state" / "boxes.json")

    def client(self, provider: str) -> Provider:
        return get_provider(provider, **FAST)  # type: ignore[arg-type]

    def land(self, provider: str, label: str) -> Box:
        """A box carrying `label` at `provider`, as a rent that crashed after its create."""
        client = self.client(provider)
        req = RentRequest(label=label, image="img", disk_gb=20)
        for offer in sorted(client.offers(), key=lambda o: o.usd_per_hour):
            try:
                return client.rent(offer, req)
            except (NoCapacity, OfferGone):
                continue  # a RunPod card listed without stock
        raise AssertionError(f"no {provider} offer could be rented")

    def boxes(self, provider: str, label: str) -> list[Box]:
        return [b for b in self.client(provider).boxes() if b.label == label]

    def row(self, label: str, provider: str = "vast", role: str = "bench", kind: str = "oneshot",
            usd_per_hour: float = 0.3, **kw: object) -> Row:
        """Write a registry row as a crashed or finished rent left it."""
        r = Row(label=label, provider=provider, role=role, kind=kind, card="RTX 4090",
                gpu_count=1, usd_per_hour=usd_per_hour, **kw)  # type: ignore[arg-type]
        return self.reg.add(r)

    def __call__(self, *args: str) -> Result:
        self.capsys.readouterr()
        self.mp.setattr(common, "_state", {})
        self.mp.setattr(sys, "argv", ["fleet", *args])
        with pytest.raises(SystemExit) as e:
            cli.main()
        got = self.capsys.readouterr()
        code = e.value.code
        return Result(code if isinstance(code, int) else 1, got.out, got.err)


@contextlib.contextmanager
def fleet_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              capsys: pytest.CaptureFixture[str]) -> Iterator[FleetRun]:
    """A sandbox for one test, and the CLI pointed at it."""
    with Sandbox(seed=7, boot_delay=0.2, poll_interval=0.01) as sbx:
        yield FleetRun(tmp_path, sbx, monkeypatch, capsys)
