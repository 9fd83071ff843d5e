"""`fleet loop` on real sandbox boxes: the real deploy and testinfra checks, the fake providers'
faults (a dead host, no capacity, a 5xx storm), an orphan made through a provider's API.

One sandbox serves the module; the roster wants one standing box per provider. Every test
starts from a settled fleet (`settle`: ticks until the roster is filled and every box is well),
so none depends on what another did before it.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import BIN, REPO, wait_for
from loopy import LOOP, Loopy, sandboxed

from fleet.core.boxes import Row
from fleet.state.loop_memory import Memory
from fleet.state.registry import Registry
from sandbox import fleet_toml

ROSTER = (("vast", "RTX 4090", 1), ("runpod", "RTX 4090", 1))


def config(state: Path, budget: float = 500) -> str:
    return fleet_toml.render(state, budget=budget, loop=LOOP, roster=ROSTER)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopy]:
    # room for the replacements the tests make
    yield from sandboxed(tmp_path_factory, "loop", config, boxes=len(ROSTER))


@pytest.fixture(autouse=True)
def no_faults(fleet: Loopy) -> Iterator[None]:
    yield from fleet.without_faults()


def test_ticks_fill_the_roster_convert_it_and_then_change_nothing(fleet: Loopy) -> None:
    rows = fleet.settle()
    assert sorted(r.provider for r in rows) == ["runpod", "vast"]
    assert all(r.standing and r.role == "live" and r.card == "RTX 4090" for r in rows)
    calm = fleet.tick()
    assert calm["actions"] == [] and sorted(calm["well"]) == sorted(r.label for r in rows)
    assert [r.label for r in fleet.live()] == [r.label for r in rows]  # nothing rented
    page = json.loads((fleet.tmp / "state" / "page" / "fleet.json").read_text())
    assert sorted(b["label"] for b in page["boxes"]) == sorted(r.label for r in rows)
    assert page["interval_s"] == 10 and page["owed"] == []
    # Vast's bill names its box at once (RunPod's only after its five-minute billing cycle)
    assert page["money"]["spent_from_bills"]["boxes"] >= 1, page["money"]
    roster = json.loads(fleet.fleet("roster", "--json").stdout)
    assert roster["money"]["boxes_from_bills"] >= 1 and roster["money"]["spent_today_usd"] > 0


def test_a_dead_host_is_replaced_in_the_same_shape(fleet: Loopy) -> None:
    fleet.settle()
    old = fleet.live("vast")[0]
    log = (fleet.tmp / "loop.jsonl").open("w")
    loop = subprocess.Popen([str(BIN / "fleet"), "loop", "--json"], cwd=REPO, env=fleet.env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        ticks = lambda: [json.loads(ln) for ln in  # noqa: E731
                         (fleet.tmp / "loop.jsonl").read_text().splitlines()
                         if ln.startswith("{")]
        wait_for("the loop's first tick", ticks, timeout=120)
        second = fleet.fleet("loop", "--once", check=False)  # the lock
        assert second.returncode == 2 and "another fleet loop leads this fleet" in second.stderr
        fleet.fleet("sandbox", "fault", "host_death", old.label)
        new = wait_for("a converted replacement", lambda: next(
            (r for r in fleet.live("vast") if r.rerent_of == old.label and r.standing
             and any(old.label in t["replaced"] for t in ticks())), None), timeout=600, poll_s=1)
    finally:
        loop.send_signal(signal.SIGTERM)
        loop.wait(timeout=60)
        log.close()
    assert new.label == f"{old.label}-r1"
    assert (new.provider, new.card, new.gpu_count, new.role, new.cloud) == \
        (old.provider, old.card, old.gpu_count, old.role, old.cloud)
    gone = fleet.rows()[old.label]
    assert gone.status in ("destroyed", "vanished") and gone.destroyed_at
    with fleet.control() as c:
        assert not [i for i in c.instances()
                    if i["label"] == old.label and i["phase"] != "destroyed"]
    # dead on two consecutive ticks, replaced on the second: two intervals, then a conversion
    dead = [t["number"] for t in ticks() if old.label in t["dead"]]
    replaced = next(t["number"] for t in ticks() if old.label in t["replaced"])
    assert dead[:2] == [replaced - 1, replaced], ticks()
    assert new.label in next(t for t in ticks() if old.label in t["replaced"])["converged"]
    checked = fleet.infra(new.label)
    assert checked.returncode == 0, checked.stdout[-3000:]


def test_an_agent_stopped_by_hand_is_back_after_one_tick(fleet: Loopy) -> None:
    row = fleet.settle()[0]
    fleet.ssh(row, "cd /root/fleet && venv/bin/python -m agent stop")
    assert not fleet.agent_alive(row)
    t = fleet.tick()
    assert row.label in t["converged"] and row.label not in t["dead"], t
    assert fleet.agent_alive(row)


def test_no_capacity_owes_the_box_until_capacity_returns(fleet: Loopy) -> None:
    row = fleet.settle()[-1]
    fleet.fleet("destroy", row.label, "--force")
    with fleet.control() as c:
        c.fault("no_capacity", f"{row.provider}.create", count=100)
    t = fleet.tick()
    owed = [o for o in t["owed"] if o["provider"] == row.provider]
    assert owed and owed[0]["reason"].startswith("no capacity"), t
    roster = json.loads(fleet.fleet("roster", "--json").stdout)
    assert [o["provider"] for o in roster["owed"]] == [row.provider]
    assert len(fleet.live(row.provider)) == 0
    with fleet.control() as c:
        c.clear_faults()
    t = fleet.tick()
    filled = fleet.live(row.provider)
    assert not t["owed"] and len(filled) == 1 and filled[0].label in t["converged"], t


def test_a_budget_too_low_owes_the_box_with_the_figures(fleet: Loopy) -> None:
    row = fleet.settle()[0]
    fleet.fleet("destroy", row.label, "--force")
    poor = fleet.tmp / "poor.toml"
    poor.write_text(config(fleet.tmp / "state", budget=0.01))
    before = len(fleet.rows())
    r = fleet.run(str(BIN / "fleet"), "--config", str(poor), "loop", "--once", "--json")
    t = json.loads(r.stdout.strip().splitlines()[-1])
    owed = [o for o in t["owed"] if o["provider"] == row.provider]
    assert owed and owed[0]["reason"].startswith("over budget"), t
    assert "would pass the daily budget $0.01" in owed[0]["reason"]
    assert len(fleet.rows()) == before  # nothing rented, not even a failed row


def test_an_orphan_is_reported_then_destroyed_after_the_grace(fleet: Loopy,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    from fleet.providers.base import RentRequest
    from fleet.providers.factory import all_providers

    fleet.settle()
    for k, v in fleet.env.items():
        monkeypatch.setenv(k, v)
    vast = dict(all_providers())["vast"]
    offer = sorted(vast.offers(card="RTX 3090"), key=lambda o: o.usd_per_hour)[0]
    reg = Registry(fleet.tmp / "state" / "boxes.json")
    label = f"live-{reg.fleet_id()}-vast-0b0b0b"
    # a rent the registry recorded and gave up (its outcome unknown), whose box landed later:
    # a label the registry never recorded would mean the registry is behind, and no sweep
    reg.add(Row(label=label, provider="vast", role="live", kind="standing", card="RTX 3090",
                gpu_count=1, usd_per_hour=offer.usd_per_hour))
    reg.mark_destroyed(label, "vanished")
    box = vast.rent(offer, RentRequest(label=label, image="img", disk_gb=10,
                                       tcp_ports=(22,), env={}))
    first = fleet.tick()
    assert any(label in o for o in first["orphans"]), first
    assert any(f"orphan {label}" in a and "destroyed in" in a
               for a in first["actions"]), first
    wait_for("the orphan destroyed after its grace", lambda: any(
        f"orphan {label}" in a and "destroyed after" in a
        for a in fleet.tick()["actions"]), timeout=120, poll_s=1)
    assert vast.box(box.box_id) is None


def test_a_storm_of_provider_errors_is_reported_and_rerents_nothing(fleet: Loopy) -> None:
    rows = fleet.settle()
    with fleet.control() as c:
        c.fault("server_error", "*", count=1000)
    for _ in range(2):  # two storm ticks: more than the dead checks a replacement needs
        t = fleet.tick()
        assert t["provider_errors"] and not t["dead"] and not t["replaced"], t
    with fleet.control() as c:
        c.clear_faults()
    t = fleet.tick()
    assert not t["provider_errors"] and sorted(t["well"]) == sorted(r.label for r in rows), t
    assert [r.label for r in fleet.live()] == [r.label for r in rows]


def test_a_box_whose_driver_drifted_is_unfit_and_replaced_on_another_machine(
        fleet: Loopy) -> None:
    fleet.settle()
    old = fleet.live("vast")[0]
    with fleet.control() as c:
        machine = next(i["machine_id"] for i in c.instances() if i["label"] == old.label)
    fleet.fleet("sandbox", "fault", "driver_drift", old.label, "--driver", "580.105.08")

    def refused() -> bool:
        status = json.loads(fleet.ssh(old, "cd /root/fleet && venv/bin/python -m agent status"))
        return status["admission"]["admitted"] is False

    wait_for("the agent refusing admission on the drifted driver", refused, timeout=120)
    ticks: list[dict[str, Any]] = []

    def replaced() -> bool:  # the loop reads the status its agent last wrote: a tick late
        ticks.append(fleet.tick())
        return old.label in ticks[-1]["replaced"]

    wait_for("the unfit box replaced", replaced, timeout=300, poll_s=0)
    unfit = [t["dead"].get(old.label, "") for t in ticks]
    assert all(why.startswith("unfit: its agent refused admission") for why in unfit[-2:]), ticks
    new_label = ticks[-1]["replaced"][old.label]
    assert new_label == f"{old.label}-r1" and new_label in ticks[-1]["converged"], ticks[-1]
    assert fleet.rows()[old.label].status == "destroyed"
    with fleet.control() as c:
        placed = next(i["machine_id"] for i in c.instances() if i["label"] == new_label)
    assert placed != machine  # the drifted machine is passed over
    memory = Memory.load(fleet.tmp / "state" / "boxes.json")
    assert f"vast/{machine}" in memory.unfit_machines
