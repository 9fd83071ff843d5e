"""Owed ports judged over many boxes of one role: each box's mates are the others of its role,
as before, but a healthy box's mates are never listed, so the work grows with the boxes, not
with their square (counted, never timed)."""

from __future__ import annotations

import sys
from typing import Any

from fleet.core.verdicts import Health
from fleet.ops import ports

INTERVAL_S = 60.0


def fleet(n: int) -> tuple[list[tuple[str, dict[str, Any]]], list[Health]]:
    """n standing boxes of one p2p role, standing for a day, all dialled and dialling but two
    that no mate dials; a box of another role beside them."""
    hosts: list[tuple[str, dict[str, Any]]] = []
    checks = []
    for i in range(n):
        name = f"live-vast-{i:04d}"
        hosts.append((name, {"role": "live", "provider": "vast", "p2p_port": 26611,
                             "public_ip": f"10.0.{i // 256}.{i % 256}",
                             "p2p_public_port": 40000 + i,
                             "standing_since": "2026-01-01T00:00:00Z"}))
        lonely = i < 2
        checks.append(Health(name, "vast", ssh=True, agent=True, peers_in=0 if lonely else 3,
                             peers_out=0 if lonely else 3, star_only=lonely))
    hosts.append(("other-vast-0", {"role": "other", "provider": "vast", "p2p_port": 30333,
                                   "public_ip": "10.9.0.1", "p2p_public_port": 41000,
                                   "standing_since": "2026-01-01T00:00:00Z"}))
    checks.append(Health("other-vast-0", "vast", ssh=True, agent=True, peers_in=0, peers_out=0,
                         star_only=True))
    return hosts, checks


def test_a_box_no_mate_dials_is_owed_a_port_counting_its_role_only() -> None:
    hosts, checks = fleet(10)
    ports.judge(hosts, checks, INTERVAL_S)
    assert [h.port_owed for h in checks[:3]] == [
        "its mapping 10.0.0.0:40000 is dialled by none of its 9 mates, while 8 of them dial "
        "others",
        "its mapping 10.0.0.1:40001 is dialled by none of its 9 mates, while 8 of them dial "
        "others", None]
    assert checks[-1].port_owed is None  # alone in its role: no mate says anything


def calls_judging(n: int) -> int:
    """The function calls (Python's and C's) made while the owed ports of n boxes are judged."""
    hosts, checks = fleet(n)
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        ports.judge(hosts, checks, INTERVAL_S)
    finally:
        sys.setprofile(None)
    return calls


def test_judging_twice_the_boxes_takes_twice_the_work_not_four_times() -> None:
    assert calls_judging(400) <= 2 * calls_judging(200)
