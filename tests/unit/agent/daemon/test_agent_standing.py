"""The standing box's duties: the node pointer, exec-snapshot recovery, the miner's pack,
the p2p mapping and the RESULT line."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from agentbox import Box, node_sha16, start_with, wait_for


def test_pointer_switch_to_a_good_binary_never_runs_two_nodes(box: Box) -> None:
    _, sha1 = start_with(box, "v1")
    old = box.pid_of("node")
    path2, sha2 = box.release("v2")
    box.point(path2, sha2)
    most = 0

    def switched() -> bool:
        nonlocal most
        most = max(most, len(box.running("node")))  # sampled all through the switch
        return node_sha16(box) == sha2[:16]

    wait_for(switched, "node switched to v2")
    assert most <= 1
    assert box.pid_of("node") != old
    assert box.status()["node"]["source"] == "pointer"
    assert box.status()["node"]["pointer"]["state"] == "applied"
    wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("version") == "v2", "v2 answers")
    wait_for(lambda: len(box.invocations("node")) == 2, "v2's start recorded")
    assert [r["version"] for r in box.invocations("node")] == ["v1", "v2"]
    assert f"switching to {sha2[:16]}" in box.journal()
    assert sha1 != sha2


@pytest.mark.parametrize("fault", ["missing", "not executable", "digest mismatch"])
def test_a_bad_pointer_is_refused_and_the_old_node_keeps_running(box: Box, fault: str) -> None:
    _, sha1 = start_with(box, "v1")
    old = box.pid_of("node")
    path2, sha2 = box.release("v2")
    text = path2.read_text()
    if fault == "missing":
        path2.unlink()
        box.point(path2, sha2)
        expected = "does not exist"
    elif fault == "not executable":
        path2.chmod(0o644)
        box.point(path2, sha2)
        expected = "is not executable"
    else:
        box.point(path2, "0" * 64)
        expected = "standing.node.sha256 says"
    view = wait_for(lambda: box.status()["node"]["pointer"]["state"] == "refused"
                    and box.status()["node"]["pointer"], "pointer refused")
    assert expected in view["reason"]
    box.wait_ticks(3)
    assert box.pid_of("node") == old
    assert node_sha16(box) == sha1[:16]
    assert f"pointer refused: {view['reason']}" in box.journal()
    # once the binary is right (it arrived, was made executable, the digest was fixed) the
    # switch goes ahead without anyone touching the pointer again
    if fault == "missing":
        path2.write_text(text)
        path2.chmod(0o755)
    elif fault == "not executable":
        path2.chmod(0o755)
    else:
        box.point(path2, sha2)
    wait_for(lambda: node_sha16(box) == sha2[:16], "node switched once the binary is right")
    assert len(box.running("node")) == 1


def test_without_a_pointer_a_running_newer_node_is_adopted_and_never_downgraded(
        box: Box) -> None:
    start_with(box, "v1")
    path2, sha2 = box.release("v2")
    box.kill_agent(box.agents[-1])
    (box.root / "standing.node").unlink()
    (box.root / "standing.node.sha256").unlink()
    for p in box.running("node"):
        p.kill()
        p.wait()
    # someone starts the newer binary by hand, the agent being down
    by_hand = subprocess.Popen(
        [str(path2), "node", "--rpc-port", str(box.rpc_port), "--state", str(box.node_state)],
        env=dict(os.environ, STANDIN_LOG=str(box.invocations_log)), start_new_session=True)
    wait_for(lambda: box.running("node"), "the hand-started node")
    box.start_agent()
    wait_for(lambda: box.program("node").get("adopted"), "node adopted")
    assert box.pid_of("node") == by_hand.pid
    assert box.status()["node"]["source"] == "adopted"
    assert node_sha16(box) == sha2[:16]
    assert box.status()["node"]["pointer"]["state"] == "absent"
    # it dies: the agent restarts the recorded (newer) binary, not the old v1
    os.kill(by_hand.pid, signal.SIGKILL)
    by_hand.wait()
    wait_for(lambda: (box.pid_of("node") or by_hand.pid) != by_hand.pid, "node restarted")
    assert node_sha16(box) == sha2[:16]
    wait_for(lambda: len(box.invocations("node")) == 3, "the restart recorded")
    assert [r["version"] for r in box.invocations("node")] == ["v1", "v2", "v2"]
    assert "recorded running binary" in box.journal()


def test_no_pointer_and_no_node_blocks_only_the_node_until_one_appears(box: Box) -> None:
    box.configure()
    box.start_agent()
    blocked = wait_for(lambda: box.program("node").get("state") == "blocked"
                       and box.program("node"), "node blocked")
    assert "no node binary" in blocked["reason"]
    wait_for(lambda: box.pid_of("miner") and box.pid_of("prover"), "GPU programs running")
    path, sha = box.release("v3")
    subprocess.Popen([str(path), "node", "--rpc-port", str(box.rpc_port)],
                     env=dict(os.environ, STANDIN_LOG=str(box.invocations_log)),
                     start_new_session=True)
    wait_for(lambda: node_sha16(box) == sha[:16], "the appearing node adopted at a reconcile")
    assert box.program("node")["adopted"] is True
    assert len(box.running("node")) == 1


def test_exec_snapshot_recovery_fires_once_per_cooldown(box: Box) -> None:
    runs = box.tmp / "recipe-runs.log"
    recipe = box.root / "in" / "box-exec-snapshot.sh"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(f"#!/bin/sh\necho start $(date +%s.%N) >> {runs}\n"
                      f"sleep 0.2\necho end $(date +%s.%N) >> {runs}\n")
    recipe.chmod(0o755)
    box.set_node_state(synced=True, blocks=2000, exec_tip=5)
    cooldown = 1.5
    start_with(box, "v1", sections={"recovery": {
        "recipe": "{root}/in/box-exec-snapshot.sh", "min_blocks": 1000, "cooldown_s": cooldown}})
    wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("blocks") == 2000, "node probed")
    box.wait_ticks(3)
    assert not runs.exists()  # exec tip is not 0: nothing to recover
    box.set_node_state(synced=True, blocks=2000, exec_tip=0)
    rec = wait_for(lambda: box.status()["recovery"]["last_outcome"] == "ok"
                   and box.status()["recovery"], "the first recovery done")
    assert rec["last_rc"] == 0 and rec["runs"] >= 1
    wait_for(lambda: box.status()["recovery"]["runs"] >= 2, "a second recovery after the cooldown")
    wait_for(lambda: runs.read_text().count("end") >= 2, "the second recipe run finished")
    lines = [ln.split() for ln in runs.read_text().splitlines()]
    lines = lines[: len(lines) // 2 * 2]  # a third run may have started meanwhile
    kinds = [ln[0] for ln in lines]
    assert kinds == ["start", "end"] * (len(lines) // 2)  # one run at a time
    stamps = [float(ln[1]) for ln in lines]
    gaps = [stamps[i + 1] - stamps[i] for i in range(1, len(stamps) - 1, 2)]  # end -> next start
    assert gaps and min(gaps) >= cooldown - 0.05  # never inside a cooldown
    assert "recovery: ok (exit 0)" in box.journal()
    assert (box.root / "log" / "recovery.log").read_text().count("--- recovery") >= 2


def test_a_new_seed_reexports_the_pack_and_restarts_the_miner(box: Box) -> None:
    exports = box.tmp / "exports.log"
    export = box.bin / "export-pack.sh"
    export.write_text(f"#!/bin/sh\necho \"$1\" >> {exports}\necho \"$1\" > \"$2/pack.txt\"\n")
    export.chmod(0o755)
    box.set_node_state(seed="seed-A")
    start_with(box, "v1", sections={"miner_pack": {
        "command": [str(export), "{seed}", "{root}"], "retry_s": 1}})
    wait_for(lambda: box.status()["miner"]["seed"] == "seed-A", "miner mining seed-A")
    # the first export may finish before or after the miner's first start (a loaded machine
    # starts it later): one or two starts so far, and exactly one more for the new seed
    before = len(box.invocations("miner"))
    assert before in (1, 2)
    box.set_node_state(seed="seed-B")
    wait_for(lambda: box.status()["miner"]["seed"] == "seed-B", "miner mining seed-B")
    assert exports.read_text().split() == ["seed-A", "seed-B"]
    assert box.status()["miner"]["pack"]["seed"] == "seed-B"
    assert len(box.invocations("miner")) == before + 1  # one restart for the new pack
    assert len(box.invocations("node")) == 1
    assert "pack: exported for seed seed-B; restarting the miner" in box.journal()


def test_p2p_mapping_reaches_the_node_and_the_result_line_reports_it(box: Box) -> None:
    box.env_extra = {"RUNPOD_PUBLIC_IP": "203.0.113.7", "RUNPOD_TCP_PORT_16111": "40111"}
    box.set_node_state(synced=True, blocks=1234, daa_score=98765, peers=8, exec_tip=1200)
    _, sha = start_with(box, "v1", result_every_s=0.5)
    assert "--p2p=203.0.113.7:40111" in box.program("node")["argv"]
    p2p = box.status()["p2p"]
    assert p2p == {"mapped": True, "provider": "runpod", "internal_port": 16111,
                   "public_ip": "203.0.113.7", "public_port": 40111, "reason": None}
    ports = json.loads(box.agent_cli("ports", "--config", str(box.config_path)).stdout)
    assert ports["public_port"] == 40111
    log = box.root / "out" / "standing.log"
    # The first line may come before every program has reported (the node's RPC answered, the
    # prover's or miner's status file not yet read): wait for a line in which every figure
    # this test checks is known, not for the first line.
    asserted = ("node_bin", "node_pid", "blocks", "daa_score", "peers", "synced", "exec_tip",
                "admission", "p2p", "prover", "miner_rate")

    def full_line() -> dict[str, str] | None:
        for line in reversed(log.read_text().splitlines()):
            words = line.split()
            if words[:2] != ["RESULT", "standing"]:
                continue
            fields = dict(w.split("=", 1) for w in words[2:])
            if all(fields.get(k, "-") != "-" for k in asserted):
                return fields
        return None

    fields = wait_for(full_line, "a RESULT line with every figure known")
    assert fields["node_bin"] == sha[:16]
    assert fields["node_pid"] == str(box.pid_of("node"))
    assert (fields["blocks"], fields["daa_score"], fields["peers"]) == ("1234", "98765", "8")
    assert (fields["synced"], fields["exec_tip"]) == ("true", "1200")
    assert fields["admission"] == "ok" and fields["p2p"] == "203.0.113.7:40111"
    assert fields["prover"] == "proving" and float(fields["miner_rate"]) >= 1000.0


def test_without_a_mapping_the_node_gets_no_p2p_arguments(box: Box) -> None:
    start_with(box, "v1")
    argv = box.program("node")["argv"]
    assert not [a for a in argv if a.startswith("--p2p")]
    assert box.status()["p2p"]["mapped"] is False
    assert "no provider port environment" in box.status()["p2p"]["reason"]
