"""inventory.py through pyinfra's own CLI: groups by role, kind and provider; orphans reported
and never deployed to; a provider that cannot be reached is one line and a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import manage
from sandbox.control_client import ControlClient

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIG = """
[fleet]
registry = "{state}/boxes.json"
known_hosts = "{state}/known_hosts"
ssh_key = "{state}/ssh/fleet"
daily_budget_usd = 500
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node"]
p2p_port = 26611
admitted_driver = "580.95.05"
[roles.bench]
kind = "oneshot"
image = "img"
disk_gb = 20
admitted_driver = "580.95.05"
"""


def clean_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VAST_"))}
    (tmp / "fleet.toml").write_text(CONFIG.format(state=tmp / "state"))
    env.update(FLEET_CONFIG=str(tmp / "fleet.toml"), PYINFRA_PROGRESS="off", HOME=str(tmp))
    return env


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[dict[str, str]]:
    state = tmp_path / "sandbox"
    try:
        manage.up(state, seed=5, boot_delay=0.1, machines_per_provider=16)
        env = clean_env(tmp_path)
        env.update(manage.load_env(state))
        yield env
    finally:
        manage.down(state)


def run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_offers_are_admissible_and_cheapest_first(sandbox: dict[str, str]) -> None:
    r = run(sandbox, str(BIN / "fleet"), "offers", "live", "--limit", "50", "--json")
    assert r.returncode == 0, r.stderr
    offers = json.loads(r.stdout)
    assert {o["provider"] for o in offers} == {"runpod", "vast"}
    prices = [o["usd_per_hour"] for o in offers]
    assert prices == sorted(prices)
    # Vast filters on the exact driver; RunPod cannot say (admission after boot guards it)
    assert {o["driver"] for o in offers if o["provider"] == "vast"} == {"580.95.05"}
    assert {o["driver"] for o in offers if o["provider"] == "runpod"} == {None}
    dry = run(sandbox, str(BIN / "fleet"), "rent", "live", "--dry-run")
    assert dry.returncode == 0 and "dry run: would rent" in dry.stdout
    assert run(sandbox, str(BIN / "fleet"), "roster", "--json").stdout.count('"label"') == 0


def test_groups_and_orphans(sandbox: dict[str, str]) -> None:
    fleet = str(BIN / "fleet")
    for role, provider in (("live", "vast"), ("live", "runpod"), ("bench", "vast")):
        r = run(sandbox, fleet, "rent", role, "--provider", provider, "--no-wait")
        assert r.returncode == 0, r.stderr
    with ControlClient(sandbox["FLEET_SANDBOX_CONTROL"]) as c:
        c.create_instances("vast", 1)  # rented behind the fleet's back: an orphan
        c.settle()
    deadline = time.monotonic() + 60
    while True:  # rented without waiting: the providers boot them meanwhile
        r = run(sandbox, fleet, "roster", "--json")
        assert r.returncode == 0, r.stderr
        states = [b["live_status"] for b in json.loads(r.stdout)["boxes"]]
        if states == ["running"] * 3:
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.5)
    inv = run(sandbox, str(BIN / "pyinfra"), "inventory.py", "debug-inventory")
    assert inv.returncode == 0, inv.stderr
    out = inv.stdout + inv.stderr
    assert "warning: orphan vast box" in out
    groups = {frozenset(line.split("Groups:")[1].strip().split(", "))
              for line in out.splitlines() if "Groups:" in line}
    assert len(groups) == 3 and groups == set([
        frozenset({"live", "standing", "vast", "inventory"}),
        frozenset({"live", "standing", "runpod", "inventory"}),
        frozenset({"bench", "oneshot", "vast", "inventory"})]), out
    assert "bulk" not in out.split("warning")[0]  # the orphan is no host


def test_unreachable_provider_is_one_line(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    env.update(RUNPOD_API_BASE_URL="http://127.0.0.1:9", VAST_URL="http://127.0.0.1:9",
               RUNPOD_API_KEY="rpa_canary_key_1", VAST_API_KEY="vast_canary_key_2")
    r = run(env, str(BIN / "pyinfra"), "inventory.py", "debug-inventory")
    assert r.returncode != 0
    errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "error: inventory: runpod" in errors[0]
    assert "Traceback" not in r.stderr
    assert "canary" not in r.stdout + r.stderr
