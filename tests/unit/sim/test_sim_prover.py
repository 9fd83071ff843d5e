"""igneum-prover, run for real: waiting for its node, idle on a stuck exec tip, proving."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from sim_helpers import RECIPE, Procs, fast_knobs, free_port, read_json, wait_for


def test_prover_follows_its_node(procs: Procs, tmp_path: Path) -> None:
    rpc_port = free_port()
    status = tmp_path / "run" / "prover.json"
    prover, _ = procs.start("igneum-prover", "--node-rpc", f"http://127.0.0.1:{rpc_port}",
                            "--status-file", str(status))
    waiting = wait_for("waiting_for_node", lambda: read_json(status))
    assert waiting["state"] == "waiting_for_node" and waiting["proofs"] == 0
    assert set(waiting) == {"state", "proofs", "ts"}

    node = procs.node(fast_knobs(exec_stuck=True), rpc_port=rpc_port)
    wait_for("idle on a stuck exec tip", lambda: (s := read_json(status)) and s["state"] == "idle")
    assert subprocess.run([str(RECIPE), str(node.datadir)], timeout=20).returncode == 0
    proving = wait_for("two proofs", lambda: (s := read_json(status)) and s["proofs"] >= 2 and s)
    assert proving["state"] == "proving"

    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(timeout=20) == 0
    back = wait_for("waiting again", lambda: (s := read_json(status)) and
                    s["state"] == "waiting_for_node" and s)
    assert back["proofs"] >= 2
    prover.send_signal(signal.SIGTERM)
    assert prover.wait(timeout=20) == 0
