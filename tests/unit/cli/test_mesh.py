"""The p2p mesh as the operator sees it: a node's inbound and outbound peers from a fresh
reading (unknown otherwise, never 0), the star-only flag after one loop interval, and
`fleet mesh`'s who-dials-whom with each remote named by its box."""

from __future__ import annotations

from typing import Any

import page_fixture as F
import pytest
from check_fixture import DATA, status

from fleet.cli import mesh_cmd
from fleet.core.boxes import Row
from fleet.core.verdicts import Health
from fleet.ops.check import judge, star_only

PEERS = [{"dir": "in", "remote": "10.77.1.2:40002", "public": True},
         {"dir": "in", "remote": "10.77.1.3:40003", "public": True},
         {"dir": "out", "remote": "10.77.1.2:40002", "public": True},
         {"dir": "in", "remote": "192.0.2.9:5555", "public": False}]


def with_peers(**rpc: Any) -> dict[str, Any]:
    s = status()
    s["node"]["rpc"].update(rpc)
    return s


def test_a_fresh_reading_carries_the_counts_and_the_peers() -> None:
    h = judge("a", DATA, with_peers(peers_in=3, peers_out=1, peer_list=PEERS), None, None)
    assert (h.peers_in, h.peers_out, h.peer_list) == (3, 1, PEERS)
    assert h.peers_word() == "3/1"


@pytest.mark.parametrize("bad", [None, -1, 1.5, True, "2"])
def test_a_count_that_is_not_a_count_is_unknown_never_zero(bad: Any) -> None:
    h = judge("a", DATA, with_peers(peers_in=bad, peers_out=bad), None, None)
    assert h.peers_in is None and h.peers_out is None and h.peers_word() == "?/?"


def test_a_frozen_reading_tells_no_peers() -> None:
    s = with_peers(peers_in=3, peers_out=1, peer_list=PEERS)
    s["ts"] = "2026-12-02T10:02:00Z"  # the reading is two minutes old
    h = judge("a", DATA, s, None, None)
    assert h.peers_in is None and h.peer_list == []


def test_star_only_is_told_once_the_box_has_stood_one_interval() -> None:
    h = Health("a", "vast", peers_in=1, peers_out=3)
    assert star_only(h, mates=3, standing_s=61, interval_s=60) is True
    assert star_only(h, mates=3, standing_s=59, interval_s=60) is None  # too early
    assert star_only(h, mates=1, standing_s=61, interval_s=60) is False  # 1 of 1 possible
    assert star_only(h, mates=0, standing_s=61, interval_s=60) is None  # alone: no mesh
    assert star_only(Health("a", "vast", peers_in=2), 3, 61, 60) is False
    assert star_only(Health("a", "vast"), 3, 61, 60) is None  # unknown count
    h.star_only = True
    assert h.peers_word() == "1/3 star-only"


def test_health_round_trips_its_peers_and_refuses_a_damaged_list() -> None:
    h = Health("a", "vast", ssh=True, agent=True, peers_in=2, peers_out=1,
               peer_list=PEERS[:2], star_only=False)
    assert Health.from_dict(h.to_dict()) == h
    with pytest.raises(ValueError):
        Health.from_dict({**h.to_dict(), "peer_list": ["10.77.1.2:40002"]})
    with pytest.raises(ValueError):
        Health.from_dict({**h.to_dict(), "peers_in": "2"})


def row(label: str, n: int, port: int | None) -> Row:
    return Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=0.3, status="running", public_ip=f"10.77.1.{n}",
               p2p_public_port=port)


def test_the_mesh_names_the_box_behind_each_remote_and_counts_the_degrees() -> None:
    rows = [row("live-a", 1, 40001), row("live-b", 2, 40002), row("live-c", 3, 40003),
            row("live-d", 4, None)]
    results = [Health("live-a", "vast", peers_in=3, peers_out=1, peer_list=PEERS),
               Health("live-b", "vast", peers_in=0, peers_out=2, star_only=True,
                      peer_list=[{"dir": "out", "remote": "10.77.1.1:40001", "public": True}]),
               Health("live-d", "vast")]
    data = mesh_cmd.mesh_data(results, rows, F.config())
    a = data["boxes"][0]
    assert [(p["dir"], p["box"]) for p in a["peers"]] == [
        ("in", "live-b"), ("in", "live-c"), ("out", "live-b"), ("in", None)]
    assert data["in_degrees"] == {"0": 1, "3": 1, "unknown": 1}
    assert (data["dialable"], data["known"], data["star_only"]) == (1, 2, ["live-b"])
    assert mesh_cmd.summary_line(data) == (
        "1 of 2 nodes dialled by a peer; in-degrees: 1 with 0 in, 1 with 3 in, 1 with "
        "unknown in; star-only: live-b; owed a port: none")
    table = mesh_cmd.peer_table(a)
    assert str(table.title) == "live-a: in/out 3/1"


def test_a_peer_the_node_names_without_an_endpoint_reads_unknown_never_none() -> None:
    results = [Health("live-a", "vast", peers_in=1, peers_out=0,
                      peer_list=[{"dir": "in", "public": True}])]
    data = mesh_cmd.mesh_data(results, [row("live-a", 1, 40001)], F.config())
    assert data["boxes"][0]["peers"] == [{"dir": "in", "remote": None, "box": None}]
    table = mesh_cmd.peer_table(data["boxes"][0])
    assert [c.plain for col in table.columns for c in col.cells] == ["in", "?", "-"]
