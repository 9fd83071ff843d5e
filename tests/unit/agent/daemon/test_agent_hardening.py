"""The agent's guards fail closed: an interrupted switch is finished, never undone; a malformed
answer never blinds it; a full disk never stops supervision; an unkillable program never makes
it spin; a clock step never makes it lose its processes; a task it left running is found again.

Each test holds one guard against the way the agent once failed without it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from agentbox import PY, UNKILLABLE, Box, ignores_sigterm, wait_for

from agent.base.config import parse_config
from agent.base.journal import Journal
from agent.daemon.observer import Observer
from agent.daemon.supervisor import Supervisor


def node_sha16(box: Box) -> str | None:
    return box.program("node").get("sha16") if box.program("node").get("state") == "running" \
        else None


def start_with(box: Box, version: str, **configure: object) -> tuple[Path, str]:
    path, sha = box.release(version)
    box.point(path, sha)
    box.configure(**configure)  # type: ignore[arg-type]
    box.start_agent()
    wait_for(lambda: node_sha16(box) == sha[:16], f"node {version} running")
    wait_for(lambda: [r for r in box.invocations("node") if r["version"] == version],
             f"node {version} has recorded its start")
    return path, sha


def agent_cli_json(box: Box, *args: str, prelude: str = "") -> dict:
    """`python -m agent ARGS` as JSON; `prelude` runs first in the same process."""
    code = f"{prelude}\nimport sys\nfrom agent.cli import main\nsys.exit(main(sys.argv[1:]))"
    done = subprocess.run([PY, "-c", code, *args, "--config", str(box.config_path)],
                          env=box.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# ====================================================================== 1. interrupted switch


def test_an_agent_killed_in_the_middle_of_a_switch_finishes_it_and_never_goes_back(
        box: Box) -> None:
    """The old node holds in its stop grace (it ignores SIGTERM) when the agent is SIGKILLed;
    the next agent must stop it and start the pointer's binary, never record the old one."""
    path1, sha1 = box.release("v1")
    box.point(path1, sha1)
    box.configure(stop_grace_s=3.0, program_overrides={"node": {"command": [
        "{node_bin}", "node", "--rpc-port", str(box.rpc_port), "--state", str(box.node_state),
        "--ignore-term"]}})
    agent = box.start_agent()
    wait_for(lambda: node_sha16(box) == sha1[:16], "v1 running")
    # answering means it is past setting SIGTERM aside: it will hold in its stop grace
    wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("version") == "v1", "v1 answers")
    old = box.pid_of("node")
    path2, sha2 = box.release("v2")
    box.point(path2, sha2)
    wait_for(lambda: f"switching to {sha2[:16]}" in box.journal(), "the switch begun")
    box.kill_agent(agent)  # while v1 ignores its SIGTERM
    assert old is not None and psutil.pid_exists(old)
    box.start_agent()
    most = 0

    def switched() -> bool:
        nonlocal most
        most = max(most, len(box.running("node")))
        return node_sha16(box) == sha2[:16] and not psutil.pid_exists(old)

    wait_for(switched, "the second agent finished the switch to v2")
    assert most <= 1 or all(p.pid == old for p in box.running("node"))
    box.wait_ticks(3)
    assert [r["version"] for r in box.invocations("node")] == ["v1", "v2"]  # v1 never again
    assert box.status()["node"]["sha16"] == sha2[:16]
    assert box.status()["node"]["source"] == "pointer"
    assert f"recorded running binary {path1}" not in box.journal()
    assert len(box.running("node")) == 1


# ====================================================================== 2. a blind observer


def test_a_malformed_rpc_answer_never_freezes_the_readings(box: Box) -> None:
    bad = box.tmp / "bad-chunks"
    start_with(box, "v1", program_overrides={"node": {"command": [
        "{node_bin}", "node", "--rpc-port", str(box.rpc_port), "--state", str(box.node_state),
        "--bad-chunks", str(bad)]}})
    wait_for(lambda: box.status()["node"]["rpc"], "a first good reading")
    bad.write_text("1")
    first = wait_for(lambda: box.status()["node"]["rpc_error"] and box.status()["node"]["rpc_at"],
                     "the malformed answer read as an error")
    wait_for(lambda: box.status()["node"]["rpc_at"] != first, "readings still taken after it")
    status = box.status()
    assert status["observer"]["alive"] is True
    assert status["node"]["rpc"] is None
    assert status["programs"]["node"]["healthy"] is False
    bad.unlink()
    wait_for(lambda: box.status()["node"]["rpc"], "good readings again")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_observer_is_restarted_and_reported(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    cfg = parse_config({"root": str(root), "tick_s": 0.05, "programs": {"node": {
        "command": "/bin/true", "status_file": str(tmp_path / "node.json")}}},
        tmp_path / "a.toml")
    cfg.layout.ensure()
    sup = Supervisor(cfg, Journal(cfg.layout.agent_log))

    def dies(name: str) -> object:
        raise SystemExit("something took the thread down")

    sup.observer = Observer(cfg, dies)  # type: ignore[arg-type]
    sup.observer.start()
    sup.observer.join(timeout=10)
    assert not sup.observer.is_alive()
    sup._keep_observer()
    view = sup.observer_view()
    assert view["alive"] is True and view["restarts"] == 1
    assert "observer: the probe thread of node ended" in cfg.layout.agent_log.read_text()
    sup.observer.stop()


# ====================================================================== 4. a full disk


@pytest.fixture
def small_run(box: Box) -> Iterator[Path]:
    """run/ on a 1 MiB tmpfs, so that it can be filled without filling the machine."""
    run = box.root / "run"
    run.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(run)], check=True)
    try:
        yield run
    finally:
        box.cleanup()
        subprocess.run(["umount", "-l", str(run)], check=False)


def outside_run(box: Box) -> dict[str, dict[str, object]]:
    """Miner and prover stand-ins writing their status outside run/: only the agent writes
    there, so nothing frees space on the full tmpfs behind the test's back."""
    return {name: {"command": [PY, f"{box.bin}/{name}.py", name, "--status",
                               str(box.tmp / f"{name}.json")],
                   "status_file": str(box.tmp / f"{name}.json")}
            for name in ("miner", "prover")}


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def test_a_switch_waits_until_it_can_be_recorded_then_happens(box: Box, small_run: Path) -> None:
    _, sha1 = start_with(box, "v1", program_overrides=outside_run(box))
    old = box.pid_of("node")
    filler = fill(small_run)
    path2, sha2 = box.release("v2")
    box.point(path2, sha2)
    wait_for(lambda: "cannot record the switch" in box.journal(), "the switch held back")
    assert [r["version"] for r in box.invocations("node")] == ["v1"]
    assert [p.pid for p in box.running("node")] == [old]
    status = agent_cli_json(box, "status")
    assert status["disk"]["full"] is True
    filler.unlink()
    wait_for(lambda: node_sha16(box) == sha2[:16], "switched once the state could be written")
    state = json.loads((small_run / "state.json").read_text())
    assert state["node_binary"]["sha256"] == sha2
    assert box.status()["storage"]["ok"] is True


def test_an_agent_starts_and_supervises_on_a_full_disk(box: Box, small_run: Path) -> None:
    box.set_node_state(synced=True, blocks=1234, exec_tip=1200)
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(result_every_s=0.5, program_overrides=outside_run(box))
    fill(small_run)
    out = open(box.tmp / "agent-0.out", "wb")
    agent = subprocess.Popen([PY, "-m", "agent", "run", "--foreground", "--config",
                              str(box.config_path)], env=box.env(), stdout=out,
                             stderr=subprocess.STDOUT)
    out.close()
    box.agents.append(agent)
    for name in ("node", "miner", "prover"):
        wait_for(lambda n=name: box.running(n) and box.invocations(n),  # type: ignore[misc]
                 f"{name} running despite the full disk")
    log = box.root / "out" / "standing.log"
    # lines come every 0.5 s; on a busy machine the first may precede the node's first answer
    lines = wait_for(lambda: [ln for ln in log.read_text().splitlines()
                              if "blocks=1234" in ln and "prover=proving" in ln],
                     "a RESULT line with the figures although status.json cannot be written")
    assert lines[-1].startswith("RESULT standing ") and "storage=failing" in lines[-1]
    assert f"node_bin={sha[:16]}" in lines[-1]
    assert not (small_run / "status.json").exists()
    status = agent_cli_json(box, "status")
    assert status["disk"]["full"] is True
    assert "cannot write" in box.journal()
    assert agent.poll() is None


# ====================================================================== 5. unkillable program

def test_a_program_that_survives_sigkill_does_not_make_the_loop_spin(box: Box) -> None:
    box.configure(stop_grace_s=0.2, tick_s=1.0, reconcile_s=5.0, program_overrides={
        "prover": {"command": [PY, f"{box.bin}/prover.py", "prover", "--status",
                               "{root}/run/prover.json", "--ignore-term"]}})
    path, sha = box.release("v1")
    box.point(path, sha)
    code = f"{UNKILLABLE}\nimport sys\nfrom agent.cli import main\nsys.exit(main(sys.argv[1:]))"
    out = open(box.tmp / "agent-0.out", "wb")
    agent = subprocess.Popen([PY, "-c", code, "run", "--foreground", "--config",
                              str(box.config_path)], env=box.env(), stdout=out,
                             stderr=subprocess.STDOUT)
    out.close()
    box.agents.append(agent)
    prover = wait_for(lambda: box.pid_of("prover"), "prover running")
    wait_for(lambda: ignores_sigterm(prover), "prover set SIGTERM aside")
    box.set_gpu(__import__("agentbox").gpu_spec(driver="595.71.05"))  # admission now refuses
    wait_for(lambda: "still there" in box.journal(), "SIGKILL sent and the prover still there",
             timeout=60)
    proc = psutil.Process(agent.pid)
    before, started = sum(proc.cpu_times()[:2]), time.monotonic()
    wait_for(lambda: time.monotonic() - started >= 3.0, "3 s of the agent's life")
    used = sum(proc.cpu_times()[:2]) - before
    assert used < 1.0, f"the agent used {used:.2f} s of CPU in 3 s: a busy wait"
    assert box.program("prover")["state"] == "stopping"
    assert agent.poll() is None


# ====================================================================== 6. clock steps

# a wall-clock step: see test_agent_clock.py


def test_recorded_times_in_the_future_are_clamped(box: Box) -> None:
    box.set_node_state(synced=True, blocks=1234, exec_tip=1200)
    (box.root / "run").mkdir(parents=True, exist_ok=True)
    (box.root / "run" / "state.json").write_text(json.dumps(
        {"last_result_at": time.time() + 86400, "recovery": {"finished_at": time.time() + 86400}}))
    start_with(box, "v1", result_every_s=600)
    log = box.root / "out" / "standing.log"
    wait_for(lambda: log.exists() and "RESULT standing" in log.read_text(),
             "a RESULT line now, not in a day")
    assert "lay in the future" in box.journal()


# ====================================================================== 7. orphaned tasks


def test_a_recipe_left_running_by_a_killed_agent_is_waited_for_not_doubled(box: Box) -> None:
    runs = box.tmp / "recipe-runs.log"
    recipe = box.root / "in" / "box-exec-snapshot.sh"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(f"#!/bin/sh\necho start $$ >> {runs}\nsleep 3\necho end $$ >> {runs}\n")
    recipe.chmod(0o755)
    box.set_node_state(synced=True, blocks=2000, exec_tip=0)
    start_with(box, "v1", sections={"recovery": {
        "recipe": "{root}/in/box-exec-snapshot.sh", "min_blocks": 1000, "cooldown_s": 0}})
    wait_for(lambda: runs.exists() and "start" in runs.read_text(), "the recipe started")
    first = int(runs.read_text().split()[1])
    box.kill_agent(box.agents[-1])
    box.start_agent()
    rec = wait_for(lambda: box.status()["recovery"]["adopted"] and box.status()["recovery"],
                   "the running recipe adopted")
    assert rec["pid"] == first and rec["state"] == "running"
    wait_for(lambda: f"end {first}" in runs.read_text(), "the first recipe ended", timeout=60)
    wait_for(lambda: box.status()["recovery"]["runs"] >= 2, "the next run, after the first")
    lines = [ln.split() for ln in runs.read_text().splitlines()]
    assert lines[:2] == [["start", str(first)], ["end", str(first)]]  # never two at once


def test_a_pack_export_left_running_is_stopped_and_redone_never_doubled(box: Box) -> None:
    exports = box.tmp / "exports.log"
    export = box.bin / "export-pack.sh"
    export.write_text(f"#!/bin/sh\necho start $$ \"$1\" >> {exports}\nsleep 3\n"
                      f"echo \"$1\" > \"$2/pack.txt\"\necho end $$ \"$1\" >> {exports}\n")
    export.chmod(0o755)
    box.set_node_state(seed="seed-A")
    start_with(box, "v1", sections={"miner_pack": {
        "command": [str(export), "{seed}", "{root}"], "retry_s": 1}})
    wait_for(lambda: exports.exists() and "start" in exports.read_text(), "an export started")
    first = int(exports.read_text().split()[1])
    box.kill_agent(box.agents[-1])
    box.start_agent()
    wait_for(lambda: box.status()["miner"]["seed"] == "seed-A", "miner mining seed-A",
             timeout=60)
    lines = [ln.split() for ln in exports.read_text().splitlines()]
    assert lines[0][:2] == ["start", str(first)]
    assert ["end", str(first), "seed-A"] not in lines  # the orphaned export was stopped
    assert [ln[0] for ln in lines] == ["start", "start", "end"]
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie"


def test_identity_survives_a_pid_record_from_another_boot(tmp_path: Path) -> None:
    from agent.base import procs

    me = procs.identify(os.getpid())
    assert me is not None
    assert procs.from_record(me.record()) == me
    assert procs.from_record({**me.record(), "boot_id": "another-boot"}) is None
    assert procs.from_record({**me.record(), "start_ticks": me.start_ticks + 1}) is None
    assert procs.from_record({"pid": os.getpid(), "create_time": 1000.0}) is None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        info = procs.identify(child.pid)
        assert info is not None and procs.is_same(child.pid, info.start_ticks)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert not procs.is_same(child.pid, info.start_ticks)


def test_a_task_recorded_only_as_intent_is_found_by_its_command_line(tmp_path: Path) -> None:
    """The agent records a task's argv before starting it and its pid after; killed between
    the two, its successor still finds the task (a session leader running that argv)."""
    from agent.daemon.tasks import Task

    script = tmp_path / "export-pack.sh"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    argv = [str(script), "seed-A"]
    record = {"pid": None, "argv": argv, "started_at": time.time()}
    assert Task.adopt("pack", record, 60) is None  # nothing runs it yet
    child = subprocess.Popen(argv, start_new_session=True)
    try:
        wait_for(lambda: psutil.Process(child.pid).cmdline()[-2:] == argv, "the script running")
        task = Task.adopt("pack", record, 60)
        assert task is not None and task.pid == child.pid and task.adopted
        assert Task.adopt("pack", {**record, "argv": [str(script), "seed-B"]}, 60) is None
    finally:
        child.kill()
        child.wait()
