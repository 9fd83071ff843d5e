"""The facts of facts/box.py run for real: each fact's own command, through `bash -c`, against
an agent installed as the deploy installs it (its code in <root>/agent, a bare venv whose .pth
names the root), started as the deploy starts it, with stand-in programs and the stand-in NVML;
stdout goes to the fact's `process` and the parsed values are checked against the box.

The fixture tests in tests/pyinfra check the command text and parse canned output; these check
that the command works and that what it prints is what the box holds. They stay out of
tests/pyinfra, whose process pyinfra-testing patches with gevent.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pynvml
import pytest
from agentbox import DRIVER, PY, UUIDS, Box, wait_for
from repo_root import ROOT

from facts.box import AgentStatus, BoxState, GpuIdentity, NodeBinary, StandingLog

REPO = ROOT
BASH = shutil.which("bash") or "/bin/bash"
BUNDLE = hashlib.sha256(b"a bundle stamp for these tests").hexdigest()
PUBLIC_IP, PUBLIC_PORT = "203.0.113.9", 40999
NODE_STATE = {"synced": True, "blocks": 4321, "daa_score": 87654, "peers": 5, "exec_tip": 4300,
              "seed": "seed-facts"}


def fact(cls: type, env: dict[str, str], **kwargs: Any) -> Any:
    """What pyinfra would make of the fact on this machine: its command run by a shell, its
    stdout lines handed to its `process`."""
    instance = cls()
    command = instance.command(**kwargs).get_raw_value()
    done = subprocess.run([BASH, "-c", command], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"{cls.__name__}: exit {done.returncode}: {done.stderr}"
    return instance.process(done.stdout.splitlines())


def install(box: Box, deps: Path) -> None:
    """The agent as the deploy leaves it: <root>/agent (code + BUNDLE stamp) and <root>/venv, a
    venv without pip whose site-packages has a .pth naming the root (operations/agent.py). The
    wheels the deploy unpacks there (psutil, nvidia-ml-py) come from `deps` instead."""
    root = box.root
    shutil.copytree(REPO / "agent", root / "agent",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "agent" / "BUNDLE").write_text(BUNDLE + "\n")
    subprocess.run([PY, "-m", "venv", "--without-pip", str(root / "venv")], check=True,
                   timeout=120)
    site = subprocess.run(
        [str(root / "venv" / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(site) / "fleet-agent.pth").write_text(f"{root}\n{deps}\n")


@pytest.fixture(scope="module")
def deps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's two dependencies and nothing else (no fleet, no pyinfra on its path)."""
    d = tmp_path_factory.mktemp("agent-deps")
    (d / "psutil").symlink_to(Path(psutil.__file__).parent)
    (d / "pynvml.py").symlink_to(Path(pynvml.__file__))
    return d


@dataclass
class Installed:
    box: Box
    node_path: Path
    node_sha: str

    @property
    def root(self) -> Path:
        return self.box.root

    def env(self) -> dict[str, str]:
        return self.box.env()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, nvml_dir: Path,
            deps: Path) -> Iterator[Installed]:
    """One box with the agent installed, configured and started the deploy's way (detached,
    from the root, over a shell), supervising node, miner and prover; read-only for the tests."""
    box = Box(tmp_path_factory.mktemp("factbox"), nvml_dir)
    try:
        install(box, deps)
        box.env_extra = {"RUNPOD_PUBLIC_IP": PUBLIC_IP, "RUNPOD_TCP_PORT_16111": str(PUBLIC_PORT)}
        box.set_node_state(**NODE_STATE)
        path, sha = box.release("v1")
        box.point(path, sha)
        box.configure(result_every_s=0.5)
        started = subprocess.run(
            [BASH, "-c", 'cd "$1" && exec venv/bin/python -m agent run --config "$1/agent.toml"',
             "start", str(box.root)], env=box.env(), capture_output=True, text=True, timeout=60)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "agent started" in started.stdout
        for name in ("node", "miner", "prover"):
            wait_for(lambda n=name: box.pid_of(n), f"{name} running")
        wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("blocks") == 4321,
                 "the node's RPC read")
        wait_for(lambda: complete(last_result(box)), "a RESULT line with every figure known")
        yield Installed(box, path, sha)
    finally:
        subprocess.run([str(box.root / "venv" / "bin" / "python"), "-m", "agent", "stop",
                        "--config", str(box.config_path)], cwd=box.root, env=box.env(),
                       capture_output=True, timeout=120)
        box.cleanup()


@pytest.fixture
def idle(tmp_path: Path, nvml_dir: Path, deps: Path) -> Iterator[Box]:
    """A box with the agent installed and configured but not running."""
    box = Box(tmp_path, nvml_dir)
    try:
        install(box, deps)
        box.configure()
        yield box
    finally:
        box.cleanup()


def result_lines(box: Box) -> list[str]:
    log = box.root / "out" / "standing.log"
    text = log.read_text() if log.exists() else ""
    return [ln for ln in text.splitlines() if ln.startswith("RESULT standing ")]


def last_result(box: Box) -> dict[str, str] | None:
    lines = result_lines(box)
    return dict(w.split("=", 1) for w in lines[-1].split()[2:]) if lines else None


def complete(fields: dict[str, str] | None) -> bool:
    """A RESULT line in which the node, miner and prover figures are all known."""
    return bool(fields) and all((fields or {}).get(k, "-") != "-" for k in (
        "node_pid", "node_bin", "blocks", "daa_score", "peers", "synced", "exec_tip",
        "miner_rate", "prover", "admission", "p2p"))


def pidfile(root: Path, name: str) -> int:
    return int(json.loads((root / "run" / f"{name}.pid").read_text())["pid"])


def agent_pid(root: Path) -> int:
    return int((root / "run" / "agent.pid").read_text().split()[0])


# --- BoxState ----------------------------------------------------------------------------------

def test_box_state_reads_the_install_the_pointer_and_the_live_agent(running: Installed) -> None:
    root = running.root
    managed = (str(root / "agent.toml"), str(root / "boot.sh"))
    state = fact(BoxState, running.env(), root=str(root), files=managed)
    version = subprocess.run([BASH, "-c", "python3 -c 'import sys; print(sys.executable); "
                              "print(\"%d.%d\" % sys.version_info[:2])'"], env=running.env(),
                             capture_output=True, text=True, check=True).stdout.split()
    assert [state["python3"], state["python_version"]] == version
    assert state["bundle"] == BUNDLE
    assert state["venv"] is True
    assert state["files"] == {
        str(root / "agent.toml"): hashlib.sha256((root / "agent.toml").read_bytes()).hexdigest(),
        str(root / "boot.sh"): None,
    }
    assert state["releases"] == [running.node_sha[:16]]
    assert state["pointer"] == str(running.node_path)
    assert state["pointer_sha256"] == running.node_sha
    assert state["agent_alive"] is True
    assert state["status"]["schema"] == 1
    assert state["status"]["agent"]["pid"] == agent_pid(root)
    assert state["status"]["programs"]["node"]["sha16"] == running.node_sha[:16]


def test_box_state_of_an_installed_agent_that_is_not_running(idle: Box) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])  # a live pid that is not an agent
    try:
        (idle.root / "run").mkdir(exist_ok=True)
        (idle.root / "run" / "agent.pid").write_text(f"{sleeper.pid}\n")
        state = fact(BoxState, idle.env(), root=str(idle.root))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert state["bundle"] == BUNDLE and state["venv"] is True
    assert state["agent_alive"] is False
    assert state["status"] is None and state["pointer"] is None and state["releases"] == []
    assert state["files"] == {}


def test_box_state_of_a_bare_box_and_of_one_without_python(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    pybin = tmp_path / "bin"  # a PATH whose only python3 is this interpreter's base
    pybin.mkdir()
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    (pybin / "python3").symlink_to(base)
    state = fact(BoxState, {"PATH": f"{pybin}:/usr/bin:/bin"}, root=str(root),
                 files=(str(root / "agent.toml"),))
    assert state["python3"] == str(pybin / "python3")
    assert state["python_version"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert state["bundle"] is None and state["venv"] is False
    assert state["agent_alive"] is False and state["status"] is None
    assert state["releases"] == [] and state["pointer"] is None
    assert state["files"] == {str(root / "agent.toml"): None}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert fact(BoxState, {"PATH": str(empty)}, root=str(root)) == BoxState.default() == {
        "python3": None}


# --- AgentStatus -------------------------------------------------------------------------------

def test_agent_status_is_the_running_agents(running: Installed) -> None:
    root, box = running.root, running.box
    status = fact(AgentStatus, running.env(), root=str(root))
    assert status["schema"] == 1
    assert status["alive"] is True
    assert status["agent_pid"] == agent_pid(root) == status["agent"]["pid"]
    assert 0 <= status["heartbeat_age_s"] <= 3 * status["agent"]["tick_s"] + 5
    assert status["agent"]["root"] == str(root) and status["agent"]["state"] == "running"
    agent = psutil.Process(status["agent_pid"])  # the installed agent, not the test's
    assert agent.cmdline() == ["venv/bin/python", "-m", "agent", "run", "--config",
                               str(box.config_path)]  # as started from the root, then detached
    for name in ("node", "miner", "prover"):
        program = status["programs"][name]
        assert program["state"] == "running", program
        assert program["pid"] == pidfile(root, name)
        assert psutil.Process(program["pid"]).is_running()
    assert status["node"]["binary"] == str(running.node_path)
    assert status["node"]["sha16"] == running.node_sha[:16]
    assert status["node"]["rpc"]["blocks"] == NODE_STATE["blocks"]
    assert status["node"]["rpc"]["seed"] == NODE_STATE["seed"]
    assert status["admission"]["admitted"] is True
    assert status["admission"]["driver"] == DRIVER and status["admission"]["uuids"] == UUIDS
    assert (status["p2p"]["public_ip"], status["p2p"]["public_port"]) == (PUBLIC_IP, PUBLIC_PORT)
    assert status["prover"]["state"] == "proving"
    assert status["miner"]["hashrate"] >= 1000.0
    assert status["agent"]["config"] == str(box.config_path)


def test_agent_status_of_an_agent_that_is_not_running(idle: Box) -> None:
    status = fact(AgentStatus, idle.env(), root=str(idle.root))
    assert status["alive"] is False and status["agent_pid"] is None
    assert status["error"] == "no status yet"


def test_agent_status_without_an_agent_is_empty(tmp_path: Path) -> None:
    (tmp_path / "fleet").mkdir()
    assert fact(AgentStatus, {"PATH": "/usr/bin:/bin"}, root=str(tmp_path / "fleet")) == {}
    assert fact(AgentStatus, {"PATH": "/usr/bin:/bin"}, root=str(tmp_path / "nowhere")) == {}


# --- GpuIdentity -------------------------------------------------------------------------------

def test_gpu_identity_is_what_nvml_reports(running: Installed) -> None:
    gpu = fact(GpuIdentity, running.env(), root=str(running.root))
    assert gpu["error"] is None
    assert gpu["driver"] == DRIVER
    assert gpu["cuda_driver_version"] == 12080 and gpu["cuda"] == "12.8"
    assert [d["uuid"] for d in gpu["devices"]] == UUIDS
    assert [d["index"] for d in gpu["devices"]] == [0, 1]
    assert [d["serial"] for d in gpu["devices"]] == ["1650123456789", None]
    assert [d["pci_bus_id"] for d in gpu["devices"]] == ["00000000:1B:00.0", "00000000:1C:00.0"]
    assert {d["name"] for d in gpu["devices"]} == {"NVIDIA H100 80GB HBM3"}
    assert {d["memory_total"] for d in gpu["devices"]} == {85899345920}


def test_gpu_identity_when_the_driver_is_not_loaded(idle: Box) -> None:
    idle.nvml_config.unlink()  # the stand-in then fails nvmlInit as an unloaded driver does
    gpu = fact(GpuIdentity, idle.env(), root=str(idle.root))
    assert gpu["driver"] is None and gpu["devices"] == []
    assert "Driver Not Loaded" in gpu["error"]


# --- StandingLog -------------------------------------------------------------------------------

def test_standing_log_is_the_last_result_line(running: Installed) -> None:
    box = running.box
    before = result_lines(box)
    fields = fact(StandingLog, running.env(), root=str(running.root))
    after = result_lines(box)
    # lines keep coming (every 0.5 s): the fact read the last one at some moment in between
    assert fields["line"] in after[len(before) - 1:]
    assert fields["node_pid"] == str(pidfile(running.root, "node"))
    assert fields["node_bin"] == running.node_sha[:16]
    assert (fields["blocks"], fields["daa_score"], fields["peers"]) == ("4321", "87654", "5")
    assert (fields["synced"], fields["exec_tip"]) == ("true", "4300")
    assert fields["admission"] == "ok" and "admission_reason" not in fields
    assert fields["p2p"] == f"{PUBLIC_IP}:{PUBLIC_PORT}"
    assert fields["prover"] == "proving" and float(fields["miner_rate"]) >= 1000.0
    assert fields["ts"].endswith("Z") and int(fields["uptime_s"]) >= 0


def test_standing_log_skips_other_lines_and_is_empty_without_a_log(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    env = {"PATH": "/usr/bin:/bin"}
    assert fact(StandingLog, env, root=str(root)) == {}
    (root / "out").mkdir(parents=True)
    (root / "out" / "standing.log").write_text(
        "RESULT standing ts=2026-12-02T10:00:00Z blocks=1\n"
        "RESULT standing ts=2026-12-02T10:10:00Z blocks=2 admission=refused "
        "admission_reason=driver_570.133.20_is_not_the_admitted_580.95.05\n"
        "note: the agent restarted\n")
    fields = fact(StandingLog, env, root=str(root))
    assert fields["ts"] == "2026-12-02T10:10:00Z" and fields["blocks"] == "2"
    assert fields["admission_reason"] == "driver_570.133.20_is_not_the_admitted_580.95.05"


# --- NodeBinary --------------------------------------------------------------------------------

def test_node_binary_pointer_file_and_running_node_agree(running: Installed) -> None:
    node = fact(NodeBinary, running.env(), root=str(running.root))
    assert node == {
        "pointer": str(running.node_path),
        "pointer_sha256": running.node_sha,
        "file_sha256": hashlib.sha256(running.node_path.read_bytes()).hexdigest(),
        "running_sha16": running.node_sha[:16],
        "running_binary": str(running.node_path),
    }
    assert node["file_sha256"] == running.node_sha


def test_node_binary_sees_a_pointer_whose_file_differs(idle: Box) -> None:
    path, sha = idle.release("v2")
    idle.point(path, "0" * 64)
    node = fact(NodeBinary, idle.env(), root=str(idle.root))
    assert node["pointer"] == str(path) and node["pointer_sha256"] == "0" * 64
    assert node["file_sha256"] == sha != node["pointer_sha256"]
    assert node["running_sha16"] is None and node["running_binary"] is None


@pytest.mark.parametrize("name", ["box", "job"])
def test_a_probe_parses_as_the_oldest_python3_a_box_may_have(name: str) -> None:
    """BoxState reports a python3 too old for the agent; the probe itself must still run
    there: no syntax past 3.5 (no f-string) and no annotation evaluated at run time."""
    import ast

    from facts import probes

    tree = ast.parse(probes.source(name), feature_version=(3, 5))
    assert not any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                   for n in ast.walk(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for hint in [node.returns, *(a.annotation for a in node.args.args)]:
                assert hint is None or isinstance(hint, ast.Name | ast.Attribute | ast.Constant), \
                    f"{name}.py: {node.name} has an annotation evaluated at run time"
