"""A mixed roster on real sandbox boxes: an NVIDIA box and two AMD boxes rented and converted by
the real standing deploy (twice, the second changing nothing, then the testinfra checks), each
admitted through its own vendor's library on the exact driver, and an AMD box on a drifted
amdgpu driver refused, its miner never started.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import BIN, REPO, wait_for, workspace
from test_standing import Fleet

from fleet.state.registry import Registry
from sandbox import fleet_toml, manage
from sandbox.control_client import ControlClient

AMDGPU, ROCM = "6.12.12", "6.4.1"  # the sandbox's majority amdgpu driver and its ROCm release
ROLE = fleet_toml.LIVE_ROLE + f"""admitted_amdgpu = "{AMDGPU}"
admitted_rocm = "{ROCM}"
allowed_rocm = ["6.4"]
"""
# one NVIDIA box and two AMD ones of different cards (so on different machines)
ROSTER = (("vast", "RTX 4090", 1), ("runpod", "MI300X", 1), ("vast", "MI300X", 1))
DRIFTED_CARD = "RX 7900 XTX"  # rented after a drift fault: its machine reports another amdgpu


def mixed(state: Path) -> str:
    return fleet_toml.render(state, roles=ROLE, roster=ROSTER)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp, env = workspace(tmp_path_factory, "amd", mixed, columns=200)
    f = Fleet(tmp, env)
    try:
        f.fleet("sandbox", "up", "--boxes", str(len(ROSTER)), "--backend", "ns")
        env.update(manage.load_env(tmp / "sandbox"))
        with ControlClient(env["FLEET_SANDBOX_CONTROL"]) as control:
            control.fault("driver_drift", "vast", 1)
        f.fleet("rent", "live", "--provider", "vast", "--card", DRIFTED_CARD)
        rows = sorted(f.rows().values(), key=lambda r: r.created_at)
        f.drifted = rows[-1].label
        f.shared = [r.label for r in rows]
        yield f
    finally:
        subprocess.run([str(BIN / "fleet"), "sandbox", "down"], cwd=REPO, env=env,
                       capture_output=True, timeout=300)
    assert not any(r.live for r in Registry(tmp / "state" / "boxes.json").rows())


@pytest.fixture(scope="module")
def converted(fleet: Fleet) -> dict[str, Any]:
    first, second = fleet.deploy(), fleet.deploy()
    wait_for("a RESULT line on every box", lambda: all(
        "RESULT standing" in fleet.ssh(label, "cat /root/fleet/out/standing.log")
        for label in fleet.rows()), timeout=180)
    infra = fleet.run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "tests/infra", check=False)
    return {"first": first, "second": second, "infra": infra}


def invocations(fleet: Fleet, label: str) -> int:
    out = fleet.ssh(label, "cat /root/fleet/miner-invocations.log 2>/dev/null | wc -l")
    return int(out.strip())


def test_the_mixed_roster_converts_twice_and_passes_the_infra_checks(
        fleet: Fleet, converted: dict[str, Any]) -> None:
    rows = fleet.rows()
    assert sorted(r.card for r in rows.values()) == ["MI300X", "MI300X", "RTX 4090",
                                                      DRIFTED_CARD]
    assert "Grand total" in converted["first"]
    total = next(line for line in converted["second"].splitlines() if "Grand total" in line)
    # Grand total <ops> <success> <error> <no change>: nothing changed, nothing failed
    assert total.split()[3:5] == ["-", "-"], converted["second"][-2000:]
    assert all(r.standing for r in rows.values())
    infra = converted["infra"]
    assert infra.returncode == 0, infra.stdout[-4000:] + infra.stderr[-2000:]


def test_each_box_is_admitted_through_its_vendors_library_on_the_exact_driver(
        fleet: Fleet, converted: dict[str, Any]) -> None:
    rows = fleet.rows()
    for label in fleet.shared:
        if label == fleet.drifted:
            continue
        admission = wait_for(f"{label} admitted", lambda lb=label: (
            a := fleet.status(lb)["admission"]) and a["admitted"] and a)
        if rows[label].card == "RTX 4090":
            assert (admission["vendor"], admission["driver"]) == ("nvidia", "580.95.05")
            continue
        assert (admission["vendor"], admission["driver"], admission["rocm"]) == (
            "amd", AMDGPU, ROCM)
        toml = fleet.ssh(label, "cat /root/fleet/agent.toml")
        assert 'gpu_vendor = "amd"' in toml and f'admitted_rocm = "{ROCM}"' in toml
        wait_for(f"{label}'s miner running", lambda lb=label: fleet.status(lb)[
            "programs"]["miner"]["state"] == "running")
        assert invocations(fleet, label) >= 1


def test_an_amd_box_on_a_drifted_amdgpu_driver_never_starts_its_miner(
        fleet: Fleet, converted: dict[str, Any]) -> None:
    label = fleet.drifted
    with ControlClient(fleet.env["FLEET_SANDBOX_CONTROL"]) as control:
        inst = next(i for i in control.instances() if i["label"] == label)
    assert inst["driver_actual"] != inst["driver_advertised"] == AMDGPU
    status = wait_for("the drifted box's verdict", lambda: (
        s := fleet.status(label)) and not s["admission"].get("pending") and s)
    admission = status["admission"]
    assert not admission["admitted"] and admission["vendor"] == "amd"
    assert admission["driver"] == inst["driver_actual"] and AMDGPU in admission["reason"]
    assert status["programs"]["miner"]["pid"] is None
    assert status["programs"]["node"]["state"] == "running"  # the node needs no GPU
    assert invocations(fleet, label) == 0
    verdict = wait_for("fleet check to name the driver", lambda: (
        v := {h["label"]: h for h in json.loads(fleet.fleet("check", "--json", check=False)
                                                .stdout)}[label]) and "admission" in " ".join(
        v["problems"]) and v)
    assert not verdict["well"] and AMDGPU in verdict["admission_reason"]
