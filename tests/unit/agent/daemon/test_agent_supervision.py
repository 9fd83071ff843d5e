"""Supervision with real processes: restarts, crash loops, adoption, one agent, stopping."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psutil
from agentbox import PY, Box, gone, ignores_sigterm, wait_for, zombie


def start_box(box: Box, **top: object) -> subprocess.Popen[bytes]:
    """An agent with node, miner and prover running (each has recorded its start)."""
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(**top)  # type: ignore[arg-type]
    agent = box.start_agent()
    for name in ("node", "miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n) and box.invocations(n), f"{name} running")
    return agent


def wait_stable(box: Box, name: str, stable_s: float = 1.0) -> int:
    """Wait until the program has been up stable_s, by the agent's own account."""
    def up() -> int | None:
        p = box.program(name)
        return p["pid"] if p.get("state") == "running" and p["uptime_s"] >= stable_s + 0.2 else None
    return wait_for(up, f"{name} up for {stable_s} s")


def test_sigkilled_programs_come_back_every_time(box: Box) -> None:
    start_box(box)
    for _ in range(3):
        for name in ("node", "miner", "prover"):
            old = wait_stable(box, name)
            os.kill(old, signal.SIGKILL)
            new = wait_for(lambda n=name, o=old: (box.pid_of(n) or o) != o and box.pid_of(n),
                           f"{name} restarted after SIGKILL of {old}")
            assert psutil.pid_exists(new)
            assert gone(old)
    for name in ("node", "miner", "prover"):  # the first start and three restarts
        wait_for(lambda n=name: len(box.invocations(n)) >= 4, f"{name} started 4 times")
        assert len(box.invocations(name)) == 4
        assert len(box.running(name)) == 1
        assert box.program(name)["failures"] == 0  # stable runs are not crashes
    assert "killed by SIGKILL" in box.journal()


def test_crash_loop_backs_off_marks_degraded_and_recovers_when_healed(box: Box) -> None:
    path, sha = box.release("v1")
    box.point(path, sha)
    healed = box.tmp / "healed"
    box.configure(programs=("node", "prover"), program_overrides={"prover": {
        "command": [PY, f"{box.bin}/prover.py", "prover", "--status", "{root}/run/prover.json",
                    "--crash-unless", str(healed)]}})
    box.start_agent()
    degraded = wait_for(lambda: box.program("prover").get("degraded") and box.program("prover"),
                        "prover marked degraded")
    assert degraded["state"] in ("backoff", "running")
    assert degraded["failures"] >= 3
    assert "crash loop" in (degraded["reason"] or "")
    assert degraded["last_exit"]["code"] == 3
    wait_for(lambda: box.program("prover").get("failures", 0) >= 5, "more retries at the cap")
    assert box.pid_of("node")  # the node is untouched by the prover's trouble
    assert len(box.invocations("node")) == 1
    healed.touch()
    wait_for(lambda: box.program("prover").get("state") == "running"
             and not box.program("prover")["degraded"]
             and box.program("prover")["failures"] == 0, "prover healed and stable")
    assert "degraded after 3 short runs" in box.journal()
    assert "stable again" in box.journal()


def test_agent_killed_and_restarted_adopts_its_programs(box: Box) -> None:
    agent = start_box(box)
    before = {n: box.pid_of(n) for n in ("node", "miner", "prover")}
    box.kill_agent(agent)
    for pid in before.values():
        assert pid is not None and psutil.pid_exists(pid)  # programs outlive the agent
    agent2 = box.start_agent()
    wait_for(lambda: all(box.program(n).get("adopted") for n in before), "all adopted")
    box.wait_ticks(3)
    for n, pid in before.items():
        assert box.pid_of(n) == pid
        assert len(box.invocations(n)) == 1  # no second start
        assert len(box.running(n)) == 1
    # an adopted program (not the agent's child) that dies is noticed and restarted
    os.kill(before["node"], signal.SIGKILL)
    wait_for(lambda: (box.pid_of("node") or before["node"]) != before["node"], "node restarted")
    assert len(box.running("node")) == 1
    assert agent2.poll() is None


def test_adoption_by_command_line_when_pidfiles_are_gone(box: Box) -> None:
    agent = start_box(box)
    before = {n: box.pid_of(n) for n in ("node", "miner", "prover")}
    box.kill_agent(agent)
    for n in before:
        (box.root / "run" / f"{n}.pid").unlink()
    box.start_agent()
    wait_for(lambda: all(box.program(n).get("adopted") for n in before), "all adopted")
    assert {n: box.pid_of(n) for n in before} == before
    assert all(len(box.invocations(n)) == 1 for n in before)


def test_a_reused_pid_in_a_pidfile_is_not_adopted(box: Box) -> None:
    """The pidfile names a live process with the wrong create time: PID reuse. It is left
    alone and the program is started fresh."""
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(programs=("node",))
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (box.root / "run").mkdir(parents=True, exist_ok=True)
        record = {"pid": bystander.pid, "create_time": 1000.0, "pgid": bystander.pid,
                  "argv": ["node"], "started_at": 1000.0, "binary": None, "sha256": None}
        (box.root / "run" / "node.pid").write_text(json.dumps(record))
        box.start_agent()
        node = wait_for(lambda: box.pid_of("node"), "node started")
        assert node != bystander.pid
        assert bystander.poll() is None
        assert box.program("node")["adopted"] is False
    finally:
        bystander.kill()
        bystander.wait()


def test_a_second_agent_exits_with_a_clear_line(box: Box) -> None:
    start_box(box)
    second = box.agent_cli("run", "--config", str(box.config_path), check=False)
    assert second.returncode == 1
    assert second.stderr.count("\n") == 1
    assert "already runs" in second.stderr
    box.wait_ticks(2)
    assert all(len(box.invocations(n)) == 1 for n in ("node", "miner", "prover"))
    assert all(len(box.running(n)) == 1 for n in ("node", "miner", "prover"))


def test_run_detaches_from_the_session_and_stop_ends_everything(box: Box) -> None:
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure()
    # as over SSH: the caller's pipes must be released and the caller may exit at once
    caller = subprocess.run([PY, "-m", "agent", "run", "--config", str(box.config_path)],
                            env=box.env(), capture_output=True, text=True, timeout=60)
    assert caller.returncode == 0, caller.stderr
    assert "agent started" in caller.stdout
    daemon = psutil.Process(int((box.root / "run" / "agent.pid").read_text()))
    assert os.getsid(daemon.pid) != os.getsid(0)  # a session of its own: no SIGHUP from ours
    assert daemon.ppid() != os.getpid()
    for name in ("node", "miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running")
    status = json.loads(box.agent_cli("status", "--config", str(box.config_path)).stdout)
    assert status["alive"] is True and status["agent_pid"] == daemon.pid
    pids = [box.pid_of(n) for n in ("node", "miner", "prover")]
    out = json.loads(box.agent_cli("stop", "--config", str(box.config_path)).stdout)
    assert out["agent"] == "stopped"
    for pid in [daemon.pid, *pids]:
        assert pid is not None
        assert gone(pid)
    status = json.loads(box.agent_cli("status", "--config", str(box.config_path)).stdout)
    assert status["alive"] is False
    assert status["agent"]["state"] == "stopped"
    assert not list((box.root / "run").glob("*.pid"))


def test_stop_without_an_agent_stops_leftover_programs(box: Box) -> None:
    agent = start_box(box)
    pids = [box.pid_of(n) for n in ("node", "miner", "prover")]
    box.kill_agent(agent)
    out = json.loads(box.agent_cli("stop", "--config", str(box.config_path)).stdout)
    assert out["agent"] == "not running"
    assert sorted(out["stopped_without_agent"]) == ["miner", "node", "prover"]
    assert all(not box.running(n) for n in ("node", "miner", "prover")), pids


def test_a_program_ignoring_sigterm_is_killed_after_the_grace(box: Box) -> None:
    box.configure(programs=("prover",), stop_grace_s=0.5, program_overrides={"prover": {
        "command": [PY, f"{box.bin}/prover.py", "prover", "--ignore-term"]}})
    box.start_agent()
    pid = wait_for(lambda: box.pid_of("prover"), "prover running")
    # running is not yet ignoring: on a busy machine its interpreter may still be starting
    wait_for(lambda: ignores_sigterm(pid), "prover set SIGTERM aside")
    out = json.loads(box.agent_cli("stop", "--config", str(box.config_path)).stdout)
    assert out["agent"] == "stopped"
    assert gone(pid)
    assert "ignored SIGTERM; sending SIGKILL" in box.journal()


def test_the_agent_reaps_orphans_of_its_programs(box: Box) -> None:
    """A program's child whose parent exits is reparented to the agent (child subreaper),
    which reaps it when it exits: no zombie is left."""
    orphan_file = box.tmp / "orphan.pid"
    # A subshell starts the orphan and exits at once, then the program carries on. The orphan
    # lives until the test kills it (its command line names the test's directory, so teardown
    # finds it too): no race between a fixed lifetime and a loaded machine.
    orphan_cmd = f"{PY} -c 'import time; time.sleep(600)' {box.tmp}/orphan"
    script = (f"( {orphan_cmd} & echo $! > {orphan_file}.tmp && mv {orphan_file}.tmp "
              f"{orphan_file} ); exec {PY} {box.bin}/prover.py prover")
    box.configure(programs=("prover",), program_overrides={"prover": {
        "command": ["sh", "-c", script]}})
    agent = box.start_agent()
    orphan = wait_for(lambda: int(orphan_file.read_text()), "the orphan's pid")
    wait_for(lambda: psutil.Process(orphan).ppid() == agent.pid,
             "the orphan reparented to the agent")
    os.kill(orphan, signal.SIGKILL)

    def reaped() -> bool:
        try:
            return psutil.Process(orphan).ppid() != agent.pid
        except psutil.NoSuchProcess:
            return True
    wait_for(reaped, "the orphan reaped")
    zombies = [c for c in psutil.Process(agent.pid).children() if zombie(c)]
    assert zombies == []


def test_log_rotation_keeps_programs_writing(box: Box) -> None:
    box.configure(programs=("prover",), log_max_bytes=20000, log_keep=2, program_overrides={
        "prover": {"command": [PY, f"{box.bin}/prover.py", "prover", "--chatty", "1000"]}})
    box.start_agent()
    pid = wait_for(lambda: box.pid_of("prover"), "prover running")
    log = box.root / "log" / "prover.log"
    wait_for(lambda: (box.root / "log" / "prover.log.2").exists(), "two rotations")

    def last_line_number(path: os.PathLike[str]) -> int:
        lines = [ln for ln in open(path, errors="replace").read().splitlines() if " line " in ln]
        return int(lines[-1].split()[2]) if lines else -1

    rotated = last_line_number(box.root / "log" / "prover.log.1")
    wait_for(lambda: last_line_number(log) > rotated, "new lines in the live log")
    assert box.pid_of("prover") == pid  # same process, same descriptor, still writing
    assert not (box.root / "log" / "prover.log.3").exists()  # log_keep = 2


def test_a_program_that_cannot_be_executed_is_retried_not_fatal(box: Box) -> None:
    missing = box.tmp / "missing-binary"
    box.configure(programs=("prover",), program_overrides={"prover": {"command": [str(missing)]}})
    agent = box.start_agent()
    wait_for(lambda: box.program("prover").get("failures", 0) >= 2, "failed starts counted")
    assert box.program("prover")["last_exit"]["error"]
    missing.write_text("#!/bin/sh\nexec sleep 60\n")
    missing.chmod(0o755)
    wait_for(lambda: box.pid_of("prover"), "prover running once it exists", timeout=30)
    assert agent.poll() is None


def test_an_agent_upgrade_restarts_no_program(box: Box) -> None:
    """SIGTERM (how a deploy replaces the agent) makes it exit and leave the programs; the
    next agent adopts every one of them."""
    agent = start_box(box)
    pids = {n: box.pid_of(n) for n in ("node", "miner", "prover")}
    box.kill_agent(agent, signal.SIGTERM)
    assert agent.returncode == 0
    assert box.status()["agent"]["state"] == "exited"
    box.start_agent()
    wait_for(lambda: all(box.program(n).get("adopted") for n in pids), "all adopted")
    assert {n: box.pid_of(n) for n in pids} == pids
    box.wait_ticks(2)
    assert all(len(box.invocations(n)) == 1 for n in pids)
