"""The agent's part of a publish: `readback` (what runs, from /proc) and `switch` (point, wait
until the new node runs synced, revert on failure), against a real agent and stand-in node."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from agentbox import PY, Box, wait_for


def agent(box: Box, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([PY, "-m", "agent", *args, "--config", str(box.config_path)],
                          env=box.env(), capture_output=True, text=True, timeout=120)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def running(box: Box, version: str) -> tuple[Path, str]:
    box.set_node_state(synced=True, blocks=1500, exec_tip=1400, unsynced_versions=["v3"])
    path, sha = box.release(version)
    box.point(path, sha)
    box.configure()
    box.start_agent()
    wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("version") == version,
             f"{version} answering")
    return path, sha


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_readback_reads_what_runs_from_proc(box: Box) -> None:
    path, sha = running(box, "v1")
    code, rb = agent(box, "readback")
    assert code == 0
    node = rb["node"]
    assert node["exe_kind"] == "script" and node["path"] == str(path)
    assert node["sha256"] == sha and node["version"] == "v1" and node["synced"] is True
    assert node["pid"] == box.pid_of("node") and node["instances"] == 1
    assert rb["miner"]["sha256"] == digest(box.bin / "miner.py")
    assert rb["prover"]["sha256"] == digest(box.bin / "prover.py")
    assert rb["pointer"] == {"target": str(path), "sha256": sha, "target_sha256": sha,
                             "written_at": rb["pointer"]["written_at"]}
    assert rb["started_after_pointer"] is True
    # the digest is of what runs, not of the file the pointer names: change the file
    path.write_text(path.read_text() + "# changed on disk\n")
    _, again = agent(box, "readback")
    assert again["node"]["sha256"] != sha  # a script is re-read: the table says "script"
    assert again["pointer"]["target_sha256"] != again["pointer"]["sha256"]


def test_switch_waits_for_synced_and_records_the_downtime(box: Box) -> None:
    _, sha1 = running(box, "v1")
    path2, sha2 = box.release("v2")
    most = 0
    proc = subprocess.Popen([PY, "-m", "agent", "switch", "--node", str(path2), "--sha256", sha2,
                             "--stable-s", "0.5", "--deadline-s", "60",
                             "--config", str(box.config_path)],
                            env=box.env(), stdout=subprocess.PIPE, text=True)

    def done() -> bool:
        nonlocal most
        most = max(most, len(box.running("node")))
        return proc.poll() is not None

    wait_for(done, "the switch command finished", timeout=90)
    out = json.loads(proc.stdout.read() if proc.stdout else "{}")
    assert proc.returncode == 0 and out["outcome"] == "switched", out
    assert most <= 1
    assert out["previous"]["sha256"] == sha1 and out["target"]["sha256"] == sha2
    node = out["readback"]["node"]
    assert node["sha256"] == sha2 and node["version"] == "v2" and node["synced"] is True
    assert out["readback"]["started_after_pointer"] is True
    sw = wait_for(lambda: agent(box, "readback")[1]["switch"].get("synced_at")
                  and agent(box, "readback")[1]["switch"], "the switch's timeline complete")
    assert sw["from_sha16"] == sha1[:16] and sw["to_sha16"] == sha2[:16]
    assert sw["old_exit_at"] <= sw["new_started_at"] <= sw["synced_at"]
    assert sw["downtime_s"] is not None and sw["downtime_s"] >= 0
    code, again = agent(box, "switch", "--node", str(path2), "--sha256", sha2,
                        "--stable-s", "0", "--deadline-s", "30")
    assert code == 0 and again["outcome"] == "unchanged"
    assert [r["version"] for r in box.invocations("node")] == ["v1", "v2"]


def test_a_release_that_never_syncs_is_reverted_and_read_back(box: Box) -> None:
    path1, sha1 = running(box, "v1")
    path3, sha3 = box.release("v3")  # the stand-in reports v3 never synced
    code, out = agent(box, "switch", "--node", str(path3), "--sha256", sha3,
                      "--stable-s", "0.5", "--deadline-s", "4")
    assert code == 3 and out["outcome"] == "reverted", out
    assert "did not run" in out["reason"]
    assert out["readback"]["node"]["sha256"] == sha1
    assert out["readback"]["pointer"]["target"] == str(path1)
    assert (box.root / "standing.node").read_text().strip() == str(path1)
    wait_for(lambda: box.program("node").get("sha16") == sha1[:16], "v1 running again")


def test_a_file_that_does_not_match_is_refused_and_nothing_changes(box: Box) -> None:
    path1, sha1 = running(box, "v1")
    path2, sha2 = box.release("v2")
    code, out = agent(box, "switch", "--node", str(path2), "--sha256", sha1)
    assert code == 1 and out["outcome"] == "refused" and "release says" in out["reason"]
    assert (box.root / "standing.node").read_text().strip() == str(path1)
    done = subprocess.run([PY, "-m", "agent", "switch", "--node", str(path2), "--sha256", "xyz",
                           "--config", str(box.config_path)], env=box.env(),
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: --sha256")


def switch_with_a_long_tick(box: Box, tick_s: float) -> tuple[str, int, dict[str, Any]]:
    """v1 running under an agent with a long tick, then `agent switch` to v2 (20 s deadline)."""
    box.set_node_state(synced=True, blocks=1500, exec_tip=1400)
    path1, sha1 = box.release("v1")
    box.point(path1, sha1)
    box.configure(tick_s=tick_s, reconcile_s=tick_s)
    box.start_agent()
    wait_for(lambda: box.running("node") and box.invocations("node"), "v1 started")
    path2, sha2 = box.release("v2")
    code, out = agent(box, "switch", "--node", str(path2), "--sha256", sha2,
                      "--stable-s", "0.5", "--deadline-s", "20")
    return sha2, code, out


def test_switch_nudges_the_agent_instead_of_waiting_for_its_tick(box: Box) -> None:
    """With a 60 s tick the pointer would be read a minute late; `switch` signals the agent
    (SIGUSR2) so it follows the pointer at once: well inside a 20 s deadline."""
    sha2, code, out = switch_with_a_long_tick(box, 60.0)
    assert code == 0 and out["outcome"] == "switched", out
    assert out["readback"]["node"]["sha256"] == sha2


def test_the_switch_timeline_is_timed_to_a_fraction_of_a_second_not_to_a_tick(box: Box) -> None:
    """With a 30 s tick, the new node's first synced answer is still timed within a second:
    while a switch awaits it the agent probes every quarter second."""
    sha2, code, out = switch_with_a_long_tick(box, 30.0)
    assert code == 0, out
    sw = wait_for(lambda: agent(box, "readback")[1]["switch"].get("synced_at")
                  and agent(box, "readback")[1]["switch"], "the switch's timeline complete",
                  timeout=20)
    assert sw["to_sha16"] == sha2[:16]
    assert "." in sw["synced_at"]  # to the millisecond
    assert sw["downtime_s"] < 5.0, sw  # a tick would make it up to 30 s
