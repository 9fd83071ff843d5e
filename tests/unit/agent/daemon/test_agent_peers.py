"""The node's peers by direction in status.json and the RESULT line: `peers_in`/`peers_out` are
counts like `peers` (anything else is unknown, never 0), `peer_list` keeps only well-formed
entries, and a stale reading reports none of them (the p2p mesh issue)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from agentbox import Box, wait_for

from agent.daemon import status
from agent.daemon.freshness import fresh_readings
from agent.daemon.probes import Reading

GOOD: dict[str, Any] = {
    "version": "1.5.0", "blocks": 10, "daa_score": 12, "peers": 3, "peers_in": 1, "peers_out": 2,
    "synced": True, "exec_tip": 8, "seed": "s",
    "peer_list": [{"dir": "in", "remote": "203.0.113.7:40111", "public": True},
                  {"dir": "out", "remote": "10.0.0.2:16111", "public": True},
                  {"dir": "out", "remote": "10.0.0.3:16111", "public": True}]}


def _status_with(rpc: dict[str, Any] | None) -> dict[str, Any]:
    """The parts of a status that result_line reads, with the node's RPC picked as build does."""
    picked = status._pick(rpc, status.NODE_FIELDS)
    return {"ts": "t", "agent": {"uptime_s": 1}, "programs": {"node": {}},
            "node": {"sha16": "x", "rpc": picked}, "miner": {}, "prover": {},
            "admission": {"admitted": True}, "p2p": {"mapped": False}}


def _fields(line: str) -> dict[str, str]:
    words = line.split()
    assert words[:2] == ["RESULT", "standing"]
    return dict(w.split("=", 1) for w in words[2:])


def test_well_formed_peer_fields_are_carried() -> None:
    picked = status._pick(GOOD, status.NODE_FIELDS)
    assert picked is not None
    assert (picked["peers"], picked["peers_in"], picked["peers_out"]) == (3, 1, 2)
    assert picked["peer_list"] == GOOD["peer_list"]
    fields = _fields(status.result_line(_status_with(GOOD)))
    assert (fields["peers"], fields["peers_in"], fields["peers_out"]) == ("3", "1", "2")
    words = status.result_line(_status_with(GOOD)).split()
    at = words.index("peers=3")
    assert words[at + 1 : at + 3] == ["peers_in=1", "peers_out=2"]  # next to peers=


@pytest.mark.parametrize("bad", [None, -1, 1.0, 2.5, math.nan, math.inf, 2**63, 2**70, True,
                                 "2", [2], {"n": 2}])
def test_a_bad_count_is_unknown_never_zero(bad: Any) -> None:
    rpc = {**GOOD, "peers_in": bad, "peers_out": bad}
    picked = status._pick(rpc, status.NODE_FIELDS)
    assert picked is not None and picked["peers_in"] is None and picked["peers_out"] is None
    fields = _fields(status.result_line(_status_with(rpc)))
    assert fields["peers_in"] == "-" and fields["peers_out"] == "-"
    assert fields["peers"] == "3"  # one bad field spoils no other


def test_missing_fields_from_an_older_node_are_unknown() -> None:
    old = {k: v for k, v in GOOD.items() if k not in ("peers_in", "peers_out", "peer_list")}
    picked = status._pick(old, status.NODE_FIELDS)
    assert picked is not None
    assert picked["peers_in"] is None and picked["peers_out"] is None
    assert picked["peer_list"] is None  # unknown, not "no peers"
    fields = _fields(status.result_line(_status_with(old)))
    assert (fields["peers"], fields["peers_in"], fields["peers_out"]) == ("3", "-", "-")


@pytest.mark.parametrize("bad", [None, "in", 3, {"dir": "in"}, True])
def test_a_peer_list_that_is_not_a_list_is_unknown(bad: Any) -> None:
    picked = status._pick({**GOOD, "peer_list": bad}, status.NODE_FIELDS)
    assert picked is not None and picked["peer_list"] is None


def test_an_empty_peer_list_stays_empty() -> None:
    picked = status._pick({**GOOD, "peer_list": []}, status.NODE_FIELDS)
    assert picked is not None and picked["peer_list"] == []


@pytest.mark.parametrize("entry", [
    "203.0.113.7:1", ["in", "203.0.113.7:1", True], None,
    {"dir": "both", "remote": "203.0.113.7:1", "public": True},
    {"dir": "IN", "remote": "203.0.113.7:1", "public": True},
    {"dir": None, "remote": "203.0.113.7:1", "public": True},
    {"remote": "203.0.113.7:1", "public": True},
    {"dir": "in", "remote": "203.0.113.7:1", "public": "true"},
    {"dir": "in", "remote": "203.0.113.7:1", "public": 1},
    {"dir": "in", "remote": "203.0.113.7:1"},
    {"dir": "in", "remote": "203.0.113.7", "public": True},
    {"dir": "in", "remote": "203.0.113.7:0", "public": True},
    {"dir": "in", "remote": "203.0.113.7:65536", "public": True},
    {"dir": "in", "remote": "203.0.113.7:080", "public": True},
    {"dir": "in", "remote": ":80", "public": True},
    {"dir": "in", "remote": "a b:80", "public": True},
    {"dir": "in", "remote": "host\n:80", "public": True},
    {"dir": "in", "remote": "h\u00f6st:80", "public": True},
    {"dir": "in", "remote": "203.0.113.7:\u0668\u0660", "public": True},
    {"dir": "in", "remote": "h" * 62 + ":80", "public": True},  # over MAX_TEXT: never cut
    {"dir": "in", "remote": 80, "public": True},
    {"dir": "in", "remote": None, "public": True},
])
def test_a_bad_peer_entry_is_dropped_and_the_rest_kept(entry: Any) -> None:
    good = GOOD["peer_list"]
    picked = status._pick({**GOOD, "peer_list": [good[0], entry, good[1]]}, status.NODE_FIELDS)
    assert picked is not None and picked["peer_list"] == [good[0], good[1]]


def test_an_entry_keeps_only_its_three_fields_and_accepts_ipv6_and_names() -> None:
    entries = [{"dir": "in", "remote": "[2001:db8::1]:443", "public": False, "extra": "x" * 999},
               {"dir": "out", "remote": "node-1.example.org:16111", "public": True}]
    picked = status._pick({**GOOD, "peer_list": entries}, status.NODE_FIELDS)
    assert picked is not None
    assert picked["peer_list"] == [{"dir": "in", "remote": "[2001:db8::1]:443", "public": False},
                                   entries[1]]
    assert len(("x" * 58) + ":65535") == status.MAX_TEXT  # the longest a remote may be
    longest = {"dir": "in", "remote": "x" * 58 + ":65535", "public": False}
    picked = status._pick({**GOOD, "peer_list": [longest]}, status.NODE_FIELDS)
    assert picked is not None and picked["peer_list"] == [longest]


def test_at_most_64_entries_are_looked_at() -> None:
    many = [{"dir": "in", "remote": f"10.0.0.{i % 250}:{1000 + i}", "public": False}
            for i in range(10_000)]
    picked = status._pick({**GOOD, "peer_list": many}, status.NODE_FIELDS)
    assert picked is not None and picked["peer_list"] == many[: status.MAX_PEER_LIST]
    assert status.MAX_PEER_LIST == 64
    assert len(status.result_line(_status_with({**GOOD, "peer_list": many}))) < 4096


def test_a_stale_reading_reports_no_peer_fields() -> None:
    fresh = Reading(dict(GOOD), None, 1.0e9, True, mono=100.0)
    [stale] = fresh_readings({"node": fresh}, limit_s=5.0, now=200.0).values()
    assert stale.stale and stale.data is None
    assert status._pick(stale.data, status.NODE_FIELDS) is None  # `rpc: null`: no figures
    fields = _fields(status.result_line(_status_with(stale.data)))
    assert (fields["peers"], fields["peers_in"], fields["peers_out"]) == ("-", "-", "-")


def test_the_agent_carries_the_peer_fields_into_status_and_result(box: Box) -> None:
    box.set_node_state(synced=True, blocks=1234, peers=3, peers_in=1, peers_out=2,
                       peer_list=[*GOOD["peer_list"], {"dir": "sideways"}])
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(result_every_s=0.5)
    box.start_agent()
    rpc = wait_for(lambda: box.status()["node"]["rpc"], "the node's RPC in the status")
    assert (rpc["peers"], rpc["peers_in"], rpc["peers_out"]) == (3, 1, 2)
    assert rpc["peer_list"] == GOOD["peer_list"]  # the malformed entry dropped
    log = box.root / "out" / "standing.log"

    def line_with_peers() -> dict[str, str] | None:
        if not log.exists():
            return None
        for line in reversed(log.read_text().splitlines()):
            fields = _fields(line)
            if fields.get("peers_in", "-") != "-":
                return fields
        return None

    fields = wait_for(line_with_peers, "a RESULT line with the peer counts")
    assert (fields["peers"], fields["peers_in"], fields["peers_out"]) == ("3", "1", "2")
