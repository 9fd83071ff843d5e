"""A batch of rents through the fleet's own rent path, under every request fault the sandbox
can inject, ends with exactly the boxes wanted: no duplicates, no orphans, and nothing billing
that the registry does not know."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleet.core.config import load
from fleet.core.errors import BudgetExceeded
from fleet.ops import offers, rent
from fleet.providers.factory import get_provider
from fleet.providers.http import RetryPolicy
from fleet.providers.sync import view
from fleet.state.registry import Registry
from sandbox import manage
from sandbox.control_client import ControlClient

CONFIG = """
[fleet]
registry = "state/boxes.json"
ssh_key = "state/ssh/fleet"
daily_budget_usd = {budget}
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node"]
p2p_port = 26611
admitted_driver = "580.95.05"
"""


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlClient]:
    state = tmp_path / "sandbox"
    try:
        manage.up(state, seed=11, boot_delay=0.2, machines_per_provider=32)
        for k, v in manage.load_env(state).items():
            monkeypatch.setenv(k, v)
        with ControlClient(manage.load_env(state)["FLEET_SANDBOX_CONTROL"]) as c:
            yield c
    finally:
        manage.down(state)


def providers() -> dict[str, object]:
    fast = RetryPolicy(attempts=5, base_delay=0.01)
    return {p: get_provider(p, retry=fast, timeout=2.0, poll_interval=0.05)
            for p in ("runpod", "vast")}


def config(tmp_path: Path, budget: float = 500.0):  # type: ignore[no-untyped-def]
    (tmp_path / "fleet.toml").write_text(CONFIG.format(budget=budget))
    return load(tmp_path / "fleet.toml")


def test_batch_under_faults_yields_exactly_the_wanted_boxes(
        tmp_path: Path, world: ControlClient) -> None:
    cfg = config(tmp_path)
    reg = Registry(cfg.registry)
    role = cfg.role("live")
    ps = providers()
    # one of everything, on both providers
    for kind, target, count in [
        ("rate_limit", "vast.create", 2), ("rate_limit", "runpod", 1),
        ("server_error", "runpod.create", 1), ("server_error", "vast.search", 1),
        ("create_timeout", "vast.create", 1), ("create_timeout", "runpod.create", 1),
        ("no_capacity", "runpod.create", 1), ("offer_gone", "vast.create", 1),
    ]:
        world.fault(kind, target, count)
    wanted = 6
    for i in range(wanted):
        p = ("vast", "runpod")[i % 2]
        found, failures = offers.search(role, [ps[p]])  # type: ignore[list-item]
        assert not failures
        rent.rent(cfg, reg, role, found, ps)  # type: ignore[arg-type]
    assert world.faults() == []  # every fault was consumed

    live = reg.live_rows()
    assert len(live) == wanted
    ids = [(r.provider, r.provider_id) for r in live]
    assert len(set(ids)) == wanted and all(pid for _, pid in ids)

    v = view(reg, ps)  # type: ignore[arg-type]
    assert v.orphans == [] and v.gone == [] and v.failures == []
    assert sorted(r.label for r, _ in v.matched) == sorted(r.label for r in live)

    # every instance the providers bill for carries a provider id the registry holds
    known = {pid for r in reg.rows() for pid in [r.provider_id] if pid}
    ledger = world.ledger(events=False)
    billed = {str(row["id"]) for row in ledger["instances"] if row["total_usd"] > 0
              or row["phase"] not in ("destroyed", "terminated")}
    assert billed <= known, f"billed but unknown: {billed - known}"
    # rows the faults made fail are kept, marked, and hold no box
    failed = [r for r in reg.rows() if r.status == "failed"]
    assert len(failed) == 2 and all(r.destroyed_at for r in failed)


def _hours_to_midnight() -> float:
    now = datetime.now(UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    return (midnight - now).total_seconds() / 3600


def test_budget_refuses_before_any_provider_call(tmp_path: Path, world: ControlClient) -> None:
    ps = providers()
    role = config(tmp_path).role("live")
    found, _ = offers.search(role, [ps["vast"]])  # type: ignore[list-item]
    # half of what the cheapest box costs until UTC midnight: a fixed budget would fit late in
    # the day (the projection runs to midnight), and crossing midnight only raises the cost
    left_h = _hours_to_midnight()
    cfg = config(tmp_path, budget=max(1e-6, min(o.usd_per_hour for o in found) * left_h / 2))
    reg = Registry(cfg.registry)
    before = len(world.instances())
    with pytest.raises(BudgetExceeded, match=r"daily budget \$"):
        rent.rent(cfg, reg, role, found, ps)  # type: ignore[arg-type]
    assert len(world.instances()) == before
    assert reg.rows() == []
    assert json.loads(json.dumps(world.ledger(events=False)))["total_usd"] == 0
