"""RunPod pods whose container restarts, driven by `fleet loop --once` on real sandbox boxes.

A restarted pod's container disk is new, and its image makes new SSH host keys where /etc/ssh
has none. The standing deploy keeps the keys on the pod's volume and its start command puts
them back first, so a restarted pod keeps the key the fleet pinned, its node and its place.
Where the kept keys are gone, the changed key is re-pinned only on RunPod's own word that the
pod restarted (its uptime), said in one line; a key that changes with no restart listed is
refused, and the box judged as one whose SSH does not answer.

One sandbox serves the module; the roster wants two standing RTX 4090 pods.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import wait_for
from loopy import LOOP, Loopy, sandboxed

from fleet.boxes import sshmux
from fleet.boxes.sshkeys import fetch_host_key
from fleet.core.boxes import Row
from fleet.state.loop_memory import Memory
from sandbox import fleet_toml

ROSTER = (("runpod", "RTX 4090", 2),)
BOXES = sum(n for _, _, n in ROSTER)
TICKS = int(LOOP["dead_checks"]) + 2  # past the point where a counted death would destroy
NODE_LOG = "/root/fleet/log/node.log"


def config(state: Path) -> str:
    return fleet_toml.render(state, loop=LOOP, roster=ROSTER)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopy]:
    yield from sandboxed(tmp_path_factory, "hostkeys", config, boxes=BOXES)


@pytest.fixture(autouse=True)
def no_faults(fleet: Loopy) -> Iterator[None]:
    yield from fleet.without_faults()


def box_id(row: Row) -> str:
    return f"{row.provider}-{row.provider_id}"


def said(t: dict[str, Any], *parts: str) -> bool:
    return any(all(p in a for p in parts) for a in t["actions"])


def served(row: Row) -> str:
    """The host key the box's sshd serves now, read as the fleet reads it."""
    assert row.ssh_host and row.ssh_port
    return fetch_host_key(row.ssh_host, row.ssh_port)


def restart(fleet: Loopy, row: Row) -> None:
    with fleet.control() as c:
        c.fault("container_restart", box_id(row))
        assert c.settle(60.0)


def node_starts(fleet: Loopy, row: Row) -> list[str]:
    return [line for line in fleet.ssh(row, f"cat {NODE_LOG}").splitlines()
            if "fresh datadir" in line or "resuming at height" in line]


def test_a_restarted_pod_keeps_its_pinned_key_its_node_and_its_place(fleet: Loopy) -> None:
    rows = fleet.settle()
    pod = rows[0]
    pinned = pod.host_key
    assert pinned and served(pod) == pinned
    kept = fleet.ssh(pod, "cd /root/fleet/ssh-host-keys && sha256sum ssh_host_*")
    assert kept == fleet.ssh(pod, "cd /etc/ssh && sha256sum ssh_host_*")
    wait_for(f"{pod.label}: its node ran", lambda: node_starts(fleet, pod), timeout=120)
    before = len(node_starts(fleet, pod))
    restart(fleet, pod)
    assert served(pod) == pinned  # put back from the volume before the image made new ones
    ticks = [fleet.tick() for _ in range(TICKS)]
    for t in ticks:
        assert not t["replaced"] and pod.label not in t["dead"], t
        assert not said(t, pod.label, "host key"), t
    assert fleet.rows()[pod.label].host_key == pinned
    assert fleet.live() == rows  # the same boxes, nothing rented, nothing destroyed

    def node_resumed() -> bool:
        starts = node_starts(fleet, pod)
        return len(starts) > before and "resuming at height" in starts[-1]

    wait_for(f"{pod.label}: its node resumed from the volume", node_resumed, timeout=120)
    wait_for(f"{pod.label}: well again", lambda: pod.label in fleet.tick()["well"], timeout=120)


def test_a_pod_whose_kept_keys_are_gone_is_repinned_on_runpods_restart_word(
        fleet: Loopy) -> None:
    rows = fleet.settle()
    pod = rows[-1]
    old = pod.host_key
    fleet.ssh(pod, "rm -r /root/fleet/ssh-host-keys")  # as a pod without a volume would be
    restart(fleet, pod)
    new = served(pod)
    assert new != old  # the image made new keys: nothing put the old ones back
    ticks: list[dict[str, Any]] = []

    def repinned() -> bool:
        ticks.append(fleet.tick())
        return said(ticks[-1], f"{pod.label}: SSH host key re-pinned", "restarted")

    wait_for(f"{pod.label}: re-pinned", repinned, timeout=300, poll_s=0)
    assert fleet.rows()[pod.label].host_key == new
    assert [a for t in ticks for a in t["actions"] if "re-pinned" in a and "not" not in a]
    wait_for(f"{pod.label}: well under its new key",
             lambda: (t := fleet.tick()) and ticks.append(t) is None and pod.label in t["well"],
             timeout=120, poll_s=0)
    assert not [t for t in ticks if t["replaced"]], ticks
    assert fleet.live() == [fleet.rows()[r.label] for r in rows]


def test_a_key_changed_with_no_restart_listed_is_refused_and_judged_as_today(
        fleet: Loopy) -> None:
    rows = fleet.settle()
    box = rows[0]
    old = box.host_key
    # a new key under the same pod, no restart: sshd re-reads its keys on SIGHUP; then the
    # connections made under the old key end (the fleet's master among them), a moment after
    # this command's own session has returned
    fleet.ssh(box, "cd /etc/ssh && rm -f ssh_host_ed25519_key* && "
                   "ssh-keygen -q -t ed25519 -N '' -f ssh_host_ed25519_key && "
                   "sshd=$(pgrep -o -x sshd) && kill -HUP $sshd && "
                   "(setsid sh -c \"sleep 1; pkill -P $sshd\" >/dev/null 2>&1 </dev/null &)")
    wait_for("the box's sshd to serve its new key", lambda: served(box) != old, timeout=60)
    assert box.ssh_host and box.ssh_port and old
    master = sshmux.path(str(fleet.tmp / "state" / "known_hosts"), "root", box.ssh_host,
                         box.ssh_port, old)
    wait_for("the fleet's connection made under the old key gone",
             lambda: master is None or not os.path.exists(master), timeout=60)
    t = fleet.tick()
    assert said(t, f"{box.label}: presents another SSH host key than the one pinned",
                "no restart since it last answered", "not re-pinned"), t
    assert box.label in t["dead"] and not said(t, "re-pinned:"), t
    assert fleet.rows()[box.label].host_key == old
    mem = Memory.load(fleet.tmp / "state" / "boxes.json")
    assert mem.dead.get(box.label) == 1
    assert box.label in mem.answered  # what RunPod listed when it last answered
