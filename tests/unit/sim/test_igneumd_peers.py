"""igneumd's peers by direction: which side dialed, the remote endpoint (the address dialed, the
dialer's announced public one, or its socket), the counts in the status and the drop of a peer
that goes away. Real P2P instances in this process on loopback ports, each with its own stop."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sim_helpers import Procs, fast_knobs, free_port, wait_for

from sandbox.sim import igneumd


class Peers:
    """Starts P2P instances (each listening, with a stop of its own); all closed at teardown.
    The instances' log lines are collected here rather than printed."""

    def __init__(self) -> None:
        self.started: list[igneumd.P2P] = []
        self.logs: list[str] = []

    def node(self, public: str | None = None, blocks: int = 7) -> igneumd.P2P:
        p2p = igneumd.P2P(free_port(), public, lambda: blocks, stop=threading.Event())
        threading.Thread(target=p2p.accept_loop, daemon=True).start()
        self.started.append(p2p)
        return p2p

    def close(self) -> None:
        """Close every instance and wait (bounded) until none holds a live connection, so no
        thread of this test logs into the next one."""
        for p2p in self.started:
            p2p.close()
        wait_for("every connection closed", lambda: all(p.count() == 0 for p in self.started))


@pytest.fixture
def peers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Peers]:
    p = Peers()
    monkeypatch.setattr(igneumd, "log", p.logs.append)
    try:
        yield p
    finally:
        p.close()


def addr(p2p: igneumd.P2P) -> str:
    return f"127.0.0.1:{p2p.port}"


def view_when(p2p: igneumd.P2P, what: str, cond: Any) -> dict[str, Any]:
    """p2p's view once cond holds for it (a bounded poll)."""
    return wait_for(what, lambda: (lambda v: v if cond(v) else None)(p2p.view()))


def hello_over_socket(p2p: igneumd.P2P, hello: bytes) -> tuple[socket.socket, list[str]]:
    """A raw peer: connects, sends `hello` and returns the socket and the node's HELLO reply."""
    conn = socket.create_connection(("127.0.0.1", p2p.port), timeout=10)
    conn.sendall(hello)
    with conn.makefile("r") as lines:
        reply = lines.readline().split()
    return conn, reply


def test_a_dials_b_out_on_a_and_in_with_a_public_endpoint_on_b(peers: Peers) -> None:
    a_public = "203.0.113.7:40111"
    a, b = peers.node(public=a_public), peers.node()
    a.set_wanted([addr(b)])
    on_a = view_when(a, "a's outbound peer", lambda v: v["peers_out"] == 1)
    assert on_a == {"peers": 1, "peers_in": 0, "peers_out": 1,
                    "peer_list": [{"dir": "out", "remote": addr(b), "public": True}]}
    on_b = view_when(b, "b's inbound peer", lambda v: v["peers_in"] == 1)
    assert on_b == {"peers": 1, "peers_in": 1, "peers_out": 0,
                    "peer_list": [{"dir": "in", "remote": a_public, "public": True}]}


def test_without_a_public_endpoint_the_inbound_peer_is_its_socket(peers: Peers) -> None:
    a, b = peers.node(), peers.node()
    a.set_wanted([addr(b)])
    on_b = view_when(b, "b's inbound peer", lambda v: v["peers_in"] == 1)
    [entry] = on_b["peer_list"]
    host, _, port = entry["remote"].rpartition(":")
    assert entry["dir"] == "in" and entry["public"] is False
    assert host == "127.0.0.1" and 0 < int(port) < 65536 and int(port) != a.port


def test_three_nodes_a_mesh_and_a_star(peers: Peers) -> None:
    a, b, c = peers.node(public="10.0.0.1:1001"), peers.node(), peers.node()
    a.set_wanted([addr(b), addr(c)])  # a dials both, nobody dials a: a star centred on a
    b.set_wanted([addr(c)])
    view_when(a, "a dialing b and c", lambda v: v["peers_out"] == 2)
    on_c = view_when(c, "c dialed by a and b", lambda v: v["peers_in"] == 2)
    on_a = a.view()
    assert on_a["peers_in"] == 0 and on_a["peers"] == 2
    assert on_c["peers_out"] == 0 and on_c["peers"] == 2
    remotes = [(e["dir"], e["public"]) for e in on_c["peer_list"]]
    assert sorted(remotes) == [("in", False), ("in", True)]
    assert {"dir": "in", "remote": "10.0.0.1:1001", "public": True} in on_c["peer_list"]
    assert on_c["peer_list"] == sorted(on_c["peer_list"],
                                       key=lambda e: (e["dir"], e["remote"], e["public"]))


def test_an_old_three_field_hello_is_a_peer_and_gets_a_three_field_answer(peers: Peers) -> None:
    node = peers.node(public="198.51.100.2:5000")
    conn, reply = hello_over_socket(node, b"HELLO 1.4.0 12\n")
    with conn:
        assert reply[0] == "HELLO" and len(reply) == 3  # an old dialer is not sent a 4th field
        on_node = view_when(node, "the old peer counted", lambda v: v["peers_in"] == 1)
        local = conn.getsockname()
        assert on_node["peer_list"] == [{"dir": "in", "remote": f"{local[0]}:{local[1]}",
                                         "public": False}]
        assert node.best() == 12


def test_a_new_dialer_gets_the_listeners_public_endpoint(peers: Peers) -> None:
    node = peers.node(public="198.51.100.2:5000")
    conn, reply = hello_over_socket(node, b"HELLO 1.5.0 3 192.0.2.9:7000\n")
    with conn:
        assert reply[0] == "HELLO" and reply[3:] == ["198.51.100.2:5000"]
        on_node = view_when(node, "the new peer counted", lambda v: v["peers_in"] == 1)
        assert on_node["peer_list"] == [{"dir": "in", "remote": "192.0.2.9:7000",
                                         "public": True}]


@pytest.mark.parametrize("field", [
    "192.0.2.9:0", "192.0.2.9:65536", "192.0.2.9:99999999", "192.0.2.9", ":7000", "192.0.2.9:",
    "192.0.2.9:-1", "192.0.2.9:7O00", "h" * 60 + ".com:7000", "bad\x01host:7000",
    "h\u00e9te:7000", "192.0.2.9:\u0667\u0660", "-x:7000", "a/b:7000", "[zz::1]:7000",
])
def test_a_bad_fourth_field_reads_as_absent(peers: Peers, field: str) -> None:
    node = peers.node()
    conn, reply = hello_over_socket(node, f"HELLO 1.5.0 3 {field}\n".encode())
    with conn:
        assert reply[0] == "HELLO"  # the handshake still succeeds
        on_node = view_when(node, "the peer counted", lambda v: v["peers_in"] == 1)
        local = conn.getsockname()
        assert on_node["peer_list"] == [{"dir": "in", "remote": f"{local[0]}:{local[1]}",
                                         "public": False}]
    logged = "\n".join(peers.logs)
    assert "ignoring a bad public endpoint" in logged and field not in logged  # never echoed


def test_the_public_endpoint_is_normalised() -> None:
    assert igneumd.public_endpoint("example.org:0080") == "example.org:80"
    assert igneumd.public_endpoint("[2001:db8::1]:443") == "[2001:db8::1]:443"
    assert igneumd.public_endpoint("a" * 62 + ":1") == "a" * 62 + ":1"  # 64 characters
    assert igneumd.public_endpoint("a" * 63 + ":1") is None


@pytest.mark.parametrize("line", [
    b"HELLO 1.5.0\n", b"HELLO 1.5.0 x\n", b"HELLO 1.5.0 1 a:1 extra\n",
    b"HELLO 1.5.0 " + b"9" * 30 + b"\n", b"HELLO 1.5.0 \xd9\xa7\n",  # 30 digits; Arabic 7
])
def test_a_malformed_hello_is_no_peer(peers: Peers, line: bytes) -> None:
    node = peers.node()
    conn, reply = hello_over_socket(node, line)
    with conn:
        assert reply == []  # closed without an answer
    assert node.view()["peers"] == 0


def test_a_peer_that_stops_drops_from_both_counts(peers: Peers) -> None:
    a, b = peers.node(public="203.0.113.7:40111"), peers.node()
    a.set_wanted([addr(b)])
    view_when(b, "b's inbound peer", lambda v: v["peers_in"] == 1)
    view_when(a, "a's outbound peer", lambda v: v["peers_out"] == 1)
    b.close()
    gone = view_when(a, "a to drop b", lambda v: v["peers"] == 0)
    assert gone == {"peers": 0, "peers_in": 0, "peers_out": 0, "peer_list": []}


def test_a_silent_peer_drops_within_the_silence_timeout(peers: Peers,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(igneumd, "PEER_SILENT_S", 1.0)
    node = peers.node()
    conn, reply = hello_over_socket(node, b"HELLO 1.5.0 3 192.0.2.9:7000\n")
    with conn:  # connected, but never says another word
        assert reply[0] == "HELLO"
        view_when(node, "the peer counted", lambda v: v["peers_in"] == 1)
        gone = wait_for("the silent peer dropped", lambda: node.view()["peers"] == 0,
                        deadline_s=6.0)
        assert gone and node.view()["peer_list"] == []


def test_the_list_is_capped_the_counts_are_not(peers: Peers) -> None:
    node = peers.node()
    conns = []
    try:
        for i in range(igneumd.MAX_PEER_LIST + 3):
            conn, reply = hello_over_socket(node, f"HELLO 1.5.0 3 192.0.2.9:{1000 + i}\n".encode())
            conns.append(conn)
            assert reply[0] == "HELLO"
        full = igneumd.MAX_PEER_LIST + 3
        view = view_when(node, "every peer counted", lambda v: v["peers_in"] == full)
        assert view["peers"] == full and len(view["peer_list"]) == igneumd.MAX_PEER_LIST
    finally:
        for conn in conns:
            conn.close()


def test_the_status_rpc_reports_directions_end_to_end(procs: Procs) -> None:
    a = procs.node(fast_knobs())
    b_p2p = free_port()
    b = procs.node(fast_knobs(), None, "--peers", f"127.0.0.1:{a.p2p_port}",
                   "--p2p-public", f"127.0.0.1:{b_p2p}", p2p_port=b_p2p)
    on_a = a.wait("a dialed by b", lambda s: s.get("peers_in") == 1)
    assert (on_a["peers"], on_a["peers_out"]) == (1, 0)
    assert on_a["peer_list"] == [{"dir": "in", "remote": f"127.0.0.1:{b_p2p}", "public": True}]
    on_b = b.wait("b dialing a", lambda s: s.get("peers_out") == 1)
    assert (on_b["peers"], on_b["peers_in"]) == (1, 0)
    assert on_b["peer_list"] == [{"dir": "out", "remote": f"127.0.0.1:{a.p2p_port}",
                                  "public": True}]
