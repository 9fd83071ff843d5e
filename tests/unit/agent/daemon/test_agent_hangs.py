"""A hung probe never freezes the agent: NVML runs in threads of its own with a deadline (at the
start, the node runs and GPU programs wait until it answers; mid-run, the probes go on and a
verdict gone stale refuses), and a node RPC that drips its answer a byte at a time is cut off
at the probe's total deadline. The stand-in NVML hangs in init while
$SANDBOX_NVML_HANG exists."""

from __future__ import annotations

import os
import signal

from agentbox import Box, wait_for


def hang_nvml(box: Box) -> None:
    hang = box.tmp / "nvml-hang"
    box.env_extra["SANDBOX_NVML_HANG"] = str(hang)
    hang.write_text("")


def test_a_hung_nvml_at_the_start_keeps_gpu_programs_waiting_and_the_node_running(
        box: Box) -> None:
    hang_nvml(box)
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure()
    box.start_agent()
    wait_for(lambda: box.pid_of("node"), "the node running")
    for name in ("miner", "prover"):
        program = wait_for(lambda n=name: box.program(n).get("state") == "blocked"
                           and box.program(n), f"{name} waiting")
        assert "waiting for NVML" in program["reason"]
    box.wait_ticks(3)
    assert box.invocations("miner") == [] and box.invocations("prover") == []
    assert box.status()["admission"]["admitted"] is False
    (box.tmp / "nvml-hang").unlink()  # NVML answers (at the next reconcile's check)
    for name in ("miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running once NVML answered")
    assert box.status()["admission"]["admitted"] is True


def test_nvml_hanging_mid_run_neither_freezes_the_readings_nor_admits_for_ever(
        box: Box) -> None:
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure()
    box.env_extra["SANDBOX_NVML_HANG"] = str(box.tmp / "nvml-hang")
    box.start_agent()
    for name in ("node", "miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running")
    node = box.pid_of("node")
    (box.tmp / "nvml-hang").write_text("")  # the next check (each reconcile, 1 s) hangs
    box.wait_ticks(10)  # 2 s: a check has started and hangs
    box.set_node_state(blocks=4321)
    wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("blocks") == 4321,
             "readings still taken while NVML hangs")
    assert "has not answered (hung?)" in box.journal()
    for name in ("miner", "prover"):  # the verdict ages past 3 reconciles + 10 s: refused
        wait_for(lambda n=name: not box.running(n), f"{name} stopped", timeout=40)
    assert "not checked for" in box.status()["admission"]["reason"]
    assert box.pid_of("node") == node
    (box.tmp / "nvml-hang").unlink()
    for name in ("miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running again")


def test_a_node_rpc_that_drips_is_cut_off_at_the_probe_deadline(box: Box) -> None:
    drip = box.tmp / "drip"
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(program_overrides={"node": {"command": [
        "{node_bin}", "node", "--rpc-port", str(box.rpc_port), "--state", str(box.node_state),
        "--drip", str(drip)]}})
    box.start_agent()
    wait_for(lambda: box.status()["node"]["rpc"], "a first good reading")
    drip.write_text("")
    error = wait_for(lambda: box.status()["node"]["rpc_error"], "the dripping answer cut off",
                     timeout=15)
    assert "no complete answer within 2 s" in error
    first = box.status()["observer"]["round_at"]
    wait_for(lambda: box.status()["observer"]["round_at"] != first, "rounds go on")
    assert box.status()["programs"]["node"]["healthy"] is False
    drip.unlink()
    wait_for(lambda: box.status()["node"]["rpc"], "good readings again", timeout=15)


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_a_hung_nvml_refuses_only_gpu_work_and_leaks_no_thread(box: Box) -> None:
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure()
    box.env_extra["SANDBOX_NVML_HANG"] = str(box.tmp / "nvml-hang")
    agent = box.start_agent()
    for name in ("node", "miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running")
    (box.tmp / "nvml-hang").write_text("")
    wait_for(lambda: "has not answered (hung?)" in box.journal(), "an NVML check hung")
    threads = threads_of(agent.pid)
    reconciles = box.ticks() + 15  # 3 s: three reconciles, each of which would check NVML
    # the node (no GPU) is supervised as usual: restarted after a SIGKILL, probed
    old = box.pid_of("node")
    assert old is not None
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: box.pid_of("node") not in (None, old), "the node restarted")
    box.set_node_state(blocks=777)
    wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("blocks") == 777,
             "the restarted node probed while NVML hangs")
    wait_for(lambda: box.ticks() >= reconciles, "three more reconciles")
    assert threads_of(agent.pid) == threads  # the hung check is not joined by another
    for name in ("miner", "prover"):  # the GPU verdict ages into a refusal
        wait_for(lambda n=name: not box.running(n), f"{name} stopped", timeout=40)
    assert "not checked for" in box.status()["admission"]["reason"]
    assert threads_of(agent.pid) == threads
    (box.tmp / "nvml-hang").unlink()
    for name in ("miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running again")
    wait_for(lambda: threads_of(agent.pid) <= threads, "the check's thread ended")
