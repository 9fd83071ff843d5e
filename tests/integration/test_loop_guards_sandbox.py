"""The loop's money and destroy guards on real sandbox boxes: the roster's cards spelled as a
person would, a rent the daily run rate refuses, a loop killed before it saved its memory, a
person's box and another registry's, a listing with a gap and a host the provider stopped
vouching for, the fleet's own key unreadable, a rent left unfinished, and a hung box.

One sandbox serves the module; the roster wants one standing RTX 4090 per provider, its
cards spelled otherwise than the providers do. Every test starts from a settled fleet.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import BIN, wait_for
from loopy import LOOP, Loopy, sandboxed

from fleet.core.boxes import Row
from fleet.state.loop_memory import Memory
from fleet.state.registry import Registry
from sandbox import fleet_toml

# the cards as a person types them: RunPod's GPU type id, and lower case
ROSTER = (("vast", "NVIDIA GeForce RTX 4090", 1), ("runpod", "rtx 4090", 1))


def config(state: Path, budget: float = 500, roster: tuple[tuple[str, str, int], ...] = ROSTER
           ) -> str:
    return fleet_toml.render(state, budget=budget, loop=LOOP, roster=roster)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopy]:
    yield from sandboxed(tmp_path_factory, "guards", config, boxes=len(ROSTER))


@pytest.fixture(autouse=True)
def no_faults(fleet: Loopy) -> Iterator[None]:
    yield from fleet.without_faults()


def other_config(fleet: Loopy, name: str, **kw: object) -> Path:
    path = fleet.tmp / name
    path.write_text(config(fleet.tmp / "state", **kw))  # type: ignore[arg-type]
    return path


def tick_with(fleet: Loopy, cfg: Path, *extra: str) -> dict[str, Any]:
    r = fleet.run(str(BIN / "fleet"), "--config", str(cfg), "loop", "--once", "--json", *extra)
    data: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return data


def test_roster_cards_spelled_otherwise_are_filled_once(fleet: Loopy) -> None:
    rows = fleet.settle()
    assert sorted(r.provider for r in rows) == ["runpod", "vast"]
    assert {r.card for r in rows} == {"RTX 4090"}
    for _ in range(3):
        t = fleet.tick()
        assert t["owed"] == [] and not [a for a in t["actions"] if ": rented " in a], t
    assert [r.label for r in fleet.live()] == [r.label for r in rows]


def test_a_rent_within_the_day_but_past_the_daily_run_rate_is_refused(fleet: Loopy) -> None:
    rows = fleet.settle()
    gone = rows[0]
    fleet.fleet("destroy", gone.label, "--force")
    # two boxes' worth for the rest of today, not for a whole day at their run rate
    rate = sum(r.usd_per_hour for r in rows)
    poor = other_config(fleet, "runrate.toml", budget=round(rate * 24 * 0.9, 3))
    before = len(fleet.rows())
    t = tick_with(fleet, poor)
    owed = [o for o in t["owed"] if o["provider"] == gone.provider]
    assert owed and owed[0]["reason"].startswith("over budget"), t
    assert len(fleet.rows()) == before  # nothing rented, not even a failed row


def test_a_loop_killed_before_saving_its_memory_never_rents_the_replacement_twice(
        fleet: Loopy) -> None:
    fleet.settle()
    old = fleet.live("vast")[0]
    registry = fleet.tmp / "state" / "boxes.json"
    fleet.fleet("sandbox", "fault", "host_death", old.label)

    def replaced() -> bool:
        before = Memory.load(registry)
        t = fleet.tick()
        if old.label in t["replaced"]:
            before.save(registry)  # as if killed before the tick saved its memory
            return True
        return False

    wait_for("the dead box replaced", replaced, timeout=600, poll_s=0)
    for _ in range(2):
        t = fleet.tick()
        assert not [a for a in t["actions"] if ": rented " in a], t
    live = fleet.live("vast")
    assert [r.label for r in live] == [f"{old.label}-r1"], live
    fleet.settle()


VAST_SDK_RENT = r"""
import json, sys
from vastai import VastAI

v = VastAI(raw=True)  # key from VAST_API_KEY, server from VAST_URL
offers = v.search_offers("gpu_name=RTX_3090 num_gpus=1", order="dph_total")
ids = []
for label in sys.argv[1:]:
    made = v.create_instance(offers[len(ids)]["id"], image="ubuntu:22.04", disk=10,
                             label=label, ssh=True, direct=True)
    ids.append(made["new_contract"])
print(json.dumps(ids))
"""


def test_a_persons_box_and_another_registrys_are_never_destroyed(
        fleet: Loopy, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.providers.factory import get_provider

    fleet.settle()
    fid = Registry(fleet.tmp / "state" / "boxes.json").fleet_id()
    foreign = "live-debug", f"live-{'abcdef' if fid != 'abcdef' else 'fedcba'}-vast-0c0c0c"
    made = fleet.run(sys.executable, "-c", VAST_SDK_RENT, *foreign)
    ids = [str(i) for i in json.loads(made.stdout)]
    for k, v in fleet.env.items():
        monkeypatch.setenv(k, v)
    try:
        started = time.monotonic()
        first = fleet.tick()
        assert sum(any(lb in o for lb in foreign) for o in first["orphans"]) == 2, first
        wait_for("ticks past the orphan grace", lambda: fleet.tick() and
                 time.monotonic() - started > 1.5 * LOOP["orphan_grace_s"], timeout=300,
                 poll_s=1)
        t = fleet.tick()
        assert sum("never destroyed" in a for a in t["actions"]) == 2, t
        with fleet.control() as c:
            alive = {str(i["id"]) for i in c.instances() if i["phase"] != "destroyed"}
        assert set(ids) <= alive
        # a loop started against an empty registry (a mistyped path, a new machine) refuses
        # to rent beside the fleet it finds on the account, naming its boxes
        lost = fleet.tmp / "elsewhere.toml"
        lost.write_text(fleet_toml.render(fleet.tmp / "elsewhere", loop=LOOP))
        refused = fleet.run(str(BIN / "fleet"), "--config", str(lost), "loop", "--once",
                            "--json", check=False)
        assert refused.returncode == 2 and "--new-fleet" in refused.stderr, refused
        assert all(r.label in refused.stderr for r in fleet.live()), refused.stderr
        assert not (fleet.tmp / "elsewhere" / "boxes.json").exists()
        # told it is a new fleet, it sees the other as orphans of another form: it reports
        # them and destroys nothing
        for _ in range(3):
            t = tick_with(fleet, lost, "--new-fleet")
        assert len(t["orphans"]) >= 4 and not [a for a in t["actions"]
                                              if "destroyed after" in a], t
        with fleet.control() as c:
            alive = {i["label"] for i in c.instances() if i["phase"] != "destroyed"}
        assert {r.label for r in fleet.live()} | set(foreign) <= alive
    finally:
        vast = get_provider("vast")
        for box_id in ids:
            vast.destroy(box_id)


def test_a_gap_in_the_listing_and_a_host_gone_silent_are_not_deaths(fleet: Loopy) -> None:
    rows = fleet.settle()
    vast = next(r for r in rows if r.provider == "vast")
    with fleet.control() as c:
        c.fault("listing_gap", "vast.list", count=1000, drop=vast.label)
    for _ in range(3):
        t = fleet.tick()
        assert t["dead"] == {} and vast.label in t["well"], t
    with fleet.control() as c:
        c.clear_faults()
    runpod = next(r for r in rows if r.provider == "runpod")
    fleet.fleet("sandbox", "fault", "heartbeat_lost", runpod.label)
    for _ in range(3):  # RunPod says the host is unreachable; the box answers SSH
        t = fleet.tick()
        assert t["dead"] == {} and runpod.label in t["well"], t
    assert [r.label for r in fleet.live()] == [r.label for r in rows]


def test_the_fleets_own_key_unreadable_is_blindness_not_death(fleet: Loopy) -> None:
    rows = fleet.settle()
    key = fleet.tmp / "state" / "ssh" / "fleet"
    shutil.move(key, key.with_suffix(".moved"))
    try:
        for _ in range(3):
            t = fleet.tick()
            assert t["dead"] == {} and any("breaker" in a and "unreadable" in a
                                           for a in t["actions"]), t
    finally:
        shutil.move(key.with_suffix(".moved"), key)
    assert [r.label for r in fleet.live()] == [r.label for r in rows]
    fleet.settle()


def test_a_rent_killed_half_way_is_resumed_and_converted(fleet: Loopy,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.ops.rent import ONSTART
    from fleet.providers.base import RentRequest
    from fleet.providers.factory import get_provider

    rows = fleet.settle()
    gone = next(r for r in rows if r.provider == "vast")
    fleet.fleet("destroy", gone.label, "--force")
    reg = Registry(fleet.tmp / "state" / "boxes.json")
    label = f"live-{reg.fleet_id()}-vast-0d0d0d"
    reg.add(Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
                gpu_count=1, usd_per_hour=gone.usd_per_hour))  # `renting`, no box id yet
    for k, v in fleet.env.items():
        monkeypatch.setenv(k, v)
    vast = get_provider("vast")
    offer = next(o for o in vast.offers(card="RTX 4090", driver="580.95.05", direct_ports=2)
                 if o.cuda == "13.0")
    key = (fleet.tmp / "state" / "ssh" / "fleet.pub").read_text().strip()
    vast.rent(offer, RentRequest(label=label, image="img", disk_gb=20, tcp_ports=(22, 26611),
                                 env={"PUBLIC_KEY": key}, onstart=ONSTART["vast"]))
    # the rent was killed after its create landed: the next ticks find, pin and convert it
    t = wait_for("the unfinished rent resumed and converted", lambda: (
        t := fleet.tick()) and label in t["converged"] and t, timeout=300, poll_s=0)
    assert not [a for a in t["actions"] if ": rented " in a], t
    row = fleet.rows()[label]
    assert row.provider_id and row.host_key and row.standing
    assert [r.label for r in fleet.live("vast")] == [label]
    fleet.settle()


def box_pids(fleet: Loopy, label: str) -> list[int]:
    """Every process of a sandbox box but its init: sshd, the agent, the programs."""
    with fleet.control() as c:
        key = next(i["box_id"] for i in c.instances() if i["label"] == label
                   and i["phase"] == "running")
    init = json.loads((fleet.tmp / "sandbox" / "boxes" / key / "box.json").read_text())["pid"]
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True,
                         check=True).stdout.split()
    parent = dict(zip(map(int, out[0::2]), map(int, out[1::2]), strict=True))

    def under(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == init:
                return True
        return False

    return [p for p in parent if under(p)]


def test_a_hung_box_never_blocks_the_check_or_the_loop(fleet: Loopy) -> None:
    rows = fleet.settle()
    hung, fine = rows[0], rows[1]
    pids = box_pids(fleet, hung.label)
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        r = fleet.run(str(BIN / "fleet"), "check", "--json", check=False, timeout=600)
        verdicts = {h["label"]: h for h in json.loads(r.stdout)}
        assert not verdicts[hung.label]["ssh"] and verdicts[fine.label]["well"], verdicts
        t = fleet.tick()  # one dead of two: no breaker, the first dead check
        assert hung.label in t["dead"] and fine.label in t["well"], t
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
    # a status command that hangs on the box has a deadline: every new start of the agent's
    # Python hangs (a .pth that sleeps), the running agent goes on (the agent reads its own
    # files without blocking, so a pipe among them no longer hangs it)
    fleet.ssh(fine, "cd /root/fleet && for d in venv/lib/python3*/site-packages; do "
                    "echo 'import time; time.sleep(600)' > \"$d/zz-hang.pth\"; done")
    try:
        r = fleet.run(str(BIN / "fleet"), "check", "--json", check=False, timeout=600)
        verdicts = {h["label"]: h for h in json.loads(r.stdout)}
        assert any("did not finish within" in p for p in verdicts[fine.label]["problems"]), \
            verdicts
    finally:
        fleet.ssh(fine, "cd /root/fleet && rm venv/lib/python3*/site-packages/zz-hang.pth && "
                        "(pkill -f 'agent [s]tatus' || true)")
    fleet.settle()
