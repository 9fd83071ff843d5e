"""igneumd, run for real on loopback: status RPC, sync, peers, exec snapshot, crashes, restarts."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from sim_helpers import RECIPE, Procs, fast_knobs, free_port, read_json, wait_for, write_json

from sandbox.releases import Release


def test_version_line_of_every_release(store: list[Release]) -> None:
    for rel in store:
        for name in ("igneumd", "igneum-miner", "igneum-prover"):
            out = subprocess.run([str(rel.file(name)), "--version"], capture_output=True,
                                 text=True, timeout=20, check=True).stdout
            assert out == f"{name} {rel.version}\n"


def test_status_shape_sync_and_growth(procs: Procs) -> None:
    node = procs.node(fast_knobs(seed_every=500))
    status = node.wait("synced past 1,000 blocks", lambda s: s["synced"] and s["blocks"] > 1000)
    assert set(status) == {"version", "blocks", "daa_score", "peers", "synced", "exec_tip", "seed",
                           "peers_in", "peers_out", "peer_list"}
    assert status["version"] == procs.release.version
    assert status["peers"] == 0
    assert status["exec_tip"] == status["blocks"] - 2
    assert status["daa_score"] >= status["blocks"]
    epoch = str(status["blocks"] // 500).encode()
    assert status["seed"] == hashlib.sha256(epoch).hexdigest()[:16]
    later = node.wait("blocks to keep coming after sync", lambda s: s["blocks"] > status["blocks"])
    assert later["daa_score"] > status["daa_score"] and later["synced"]


def test_a_node_behind_reports_syncing_and_unknown_paths_404(procs: Procs) -> None:
    node = procs.node(fast_knobs(network_height=10_000_000, sync_blocks_per_s=1000))
    status = node.wait("sync progress", lambda s: s["blocks"] > 100)
    assert status["synced"] is False
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(node.rpc + "/nope", timeout=5)
    assert err.value.code == 404


def test_two_nodes_peer_and_the_newcomer_syncs_from_its_peer(procs: Procs, tmp_path: Path) -> None:
    a = procs.node(fast_knobs(network_height=2000))
    a.wait("a synced", lambda s: s["synced"])
    b_p2p = free_port()
    peers_file = tmp_path / "peers.txt"
    # b's own public address is in the list (an agent writes every box's): it must not dial itself
    peers_file.write_text(f"# the fleet\n127.0.0.1:{a.p2p_port}\n127.0.0.1:{b_p2p}\n")
    b = procs.node(fast_knobs(network_height=0, blocks_per_s=1), None,
                   "--peers-file", str(peers_file), "--p2p-public", f"127.0.0.1:{b_p2p}",
                   p2p_port=b_p2p)
    a.wait("a to count b", lambda s: s["peers"] == 1)
    synced = b.wait("b to sync up to a's height", lambda s: s["synced"] and s["blocks"] >= 2000)
    assert synced["peers"] == 1

    b.proc.send_signal(signal.SIGTERM)
    assert b.proc.wait(timeout=20) == 0
    a.wait("a to notice b left", lambda s: s["peers"] == 0)


def test_p2p_handshake_on_the_wire(procs: Procs) -> None:
    node = procs.node(fast_knobs())
    node.wait("synced", lambda s: s["synced"])
    with socket.create_connection(("127.0.0.1", node.p2p_port), timeout=10) as conn:
        conn.sendall(b"HELLO test 7\n")
        reply = conn.makefile("r").readline().split()
        assert reply[:2] == ["HELLO", procs.release.version] and int(reply[2]) > 1000
        node.wait("the raw peer to count", lambda s: s["peers"] == 1)
    node.wait("the raw peer to be gone", lambda s: s["peers"] == 0)
    with socket.create_connection(("127.0.0.1", node.p2p_port), timeout=10) as conn:
        conn.sendall(b"GET / HTTP/1.0\n")
        assert conn.makefile("r").readline() == ""  # not a peer: closed without a reply


def test_dialer_retries_until_the_peer_appears(procs: Procs) -> None:
    a_p2p = free_port()
    b = procs.node(fast_knobs(), None, "--peers", f"127.0.0.1:{a_p2p}")
    a = procs.node(fast_knobs(), p2p_port=a_p2p)
    b.wait("b to reach a once it listens", lambda s: s["peers"] == 1)
    assert a.status() is not None


def test_exec_stuck_until_the_recipe_places_a_snapshot(procs: Procs) -> None:
    node = procs.node(fast_knobs(exec_stuck=True))
    stuck = node.wait("synced with a stuck exec tip",
                      lambda s: s["synced"] and s["blocks"] > 1000 and s["exec_tip"] == 0)
    assert stuck["blocks"] > 1000
    env = {**os.environ, "IGNEUM_DATADIR": str(node.datadir)}
    run = subprocess.run([str(RECIPE)], env=env, capture_output=True, text=True, timeout=20)
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.splitlines()) == 1 and "ok" in run.stdout
    moving = node.wait("exec tip to follow blocks", lambda s: s["exec_tip"] > 0)
    assert moving["exec_tip"] == moving["blocks"] - 2
    assert read_json(node.knobs) == {**fast_knobs(), "exec_stuck": False}
    snapshot = node.datadir / "exec.snapshot"
    wait_for("the node to consume the snapshot", lambda: not snapshot.exists())


def test_recipe_takes_its_argument_and_fails_on_a_missing_datadir(tmp_path: Path) -> None:
    ok = subprocess.run([str(RECIPE), str(tmp_path)], capture_output=True, text=True, timeout=20,
                        env={**os.environ, "IGNEUM_DATADIR": str(tmp_path / "elsewhere")})
    assert ok.returncode == 0 and (tmp_path / "exec.snapshot").read_text().startswith("exec-")
    env = {**os.environ, "IGNEUM_DATADIR": str(tmp_path / "missing")}
    bad = subprocess.run([str(RECIPE)], capture_output=True, text=True, timeout=20, env=env)
    assert bad.returncode == 1
    missing = tmp_path / "missing"
    assert bad.stdout.splitlines() == [f"exec-snapshot: failed: no node datadir at {missing}"]


def test_crash_knobs_exit_with_status_1(procs: Procs) -> None:
    later = procs.node(fast_knobs(crash_after_s=1.0))
    now = procs.node(fast_knobs())
    write_json(now.knobs, fast_knobs(crash_now=True))
    assert now.proc.wait(timeout=20) == 1
    assert later.proc.wait(timeout=20) == 1
    assert "crashing on purpose" in later.log.read_text()


def test_restart_resumes_height_and_one_datadir_takes_one_node(procs: Procs) -> None:
    knobs = fast_knobs(network_height=1500)
    first = procs.node(knobs)
    before = first.wait("synced past 1,000", lambda s: s["synced"] and s["blocks"] > 1000)
    # a second node on the same datadir refuses (exit 2) and leaves the first running
    second, log = procs.start("igneumd", "--datadir", str(first.datadir), "--p2p-port",
                              str(free_port()), "--rpc-port", str(free_port()))
    assert second.wait(timeout=20) == 2 and "in use" in log.read_text()
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(timeout=20) == 0
    saved = json.loads((first.datadir / "state.json").read_text())
    assert saved["height"] >= before["blocks"]

    again = procs.node(None, first.datadir)
    resumed = again.status()
    assert resumed is not None and resumed["blocks"] >= saved["height"]


def test_unreadable_knobs_keep_the_last_good_values(procs: Procs) -> None:
    node = procs.node(fast_knobs(exec_stuck=True))
    node.wait("a stuck exec tip", lambda s: s["synced"] and s["exec_tip"] == 0)
    node.knobs.write_text("{not json")
    wait_for("a complaint in the log", lambda: "ignoring unreadable" in node.log.read_text())
    status = node.status()
    assert status is not None and status["exec_tip"] == 0 and node.proc.poll() is None
