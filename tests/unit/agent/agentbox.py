"""Test helpers for the agent: a box in a temporary directory (the agent's root, stand-in
programs, a stand-in NVML, or on an AMD box the stand-in AMD SMI).

Everything a test starts carries the test's temporary path in its command line, so teardown
finds and kills it all (agent, programs, their groups), whether the test passed or not.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from loopback import free_port

from agent.contract import job_area
from sandbox.backend import GpuDevice, GpuSpec
from sandbox.standin import write_world

PY = sys.executable
STANDIN = Path(__file__).with_name("standin.py")
DRIVER = "580.95.05"
UUIDS = ["GPU-0f6a1c2e-0000-4000-8000-000000000001", "GPU-0f6a1c2e-0000-4000-8000-000000000002"]
AMD_DRIVER = "6.12.12"  # the amdgpu driver, as amdsmi_get_gpu_driver_info says it
ROCM = "6.4.1"
AMD_UUIDS = ["a1ff74a1-0000-1000-80fd-5fe0a2f6c3b1", "a1ff74a1-0000-1000-80fd-5fe0a2f6c3b2"]


def ignores_sigterm(pid: int) -> bool:
    """Whether the process's SIGTERM disposition is 'ignore' (the SigIgn mask of its status).
    A stand-in started with --ignore-term sets it only once its interpreter has started: a
    test that stops it must wait for this first, or a prompt SIGTERM ends it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def spawn_ignoring_sigterm(argv: list[str]) -> subprocess.Popen[bytes]:
    """A process in its own session that ignores SIGTERM from its first instruction: the
    disposition is set in the child before exec, and an ignored signal stays ignored across
    exec. For a process the agent may find and signal the moment it appears."""
    return subprocess.Popen(argv, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))


def gpu_spec(driver: str = DRIVER, uuids: list[str] | None = None) -> GpuSpec:
    devices = [
        GpuDevice(u, "NVIDIA H100 80GB HBM3", f"00000000:{0x1B + i:02X}:00.0", 85899345920,
                  None if i else "1650123456789")
        for i, u in enumerate(UUIDS if uuids is None else uuids)
    ]
    return GpuSpec(driver, 12080, devices)


def amd_gpu_spec(driver: str = AMD_DRIVER, rocm: str = ROCM,
                 uuids: list[str] | None = None) -> GpuSpec:
    devices = [
        GpuDevice(u, "AMD Instinct MI300X", f"0000:{0x1B + i:02x}:00.0", 206158430208,
                  None if i else "692251001234")
        for i, u in enumerate(AMD_UUIDS if uuids is None else uuids)
    ]
    return GpuSpec(driver, 0, devices, vendor="amd", rocm_version=rocm)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll until condition() is truthy and return its value; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except (OSError, ValueError, KeyError, TypeError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.05)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


class Box:
    def __init__(self, tmp: Path, nvml_dir: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "fleet"
        self.bin = tmp / "bin"
        self.nvml_dir = nvml_dir
        self.nvml_config = tmp / "nvml.json"
        self.amdsmi_config = tmp / "amdsmi.json"
        self.invocations_log = tmp / "invocations.log"
        self.node_state = tmp / "nodestate.json"
        self.rpc_port = free_port()
        self.config_path = self.root / "agent.toml"
        self.agents: list[subprocess.Popen[bytes]] = []
        self.env_extra: dict[str, str] = {}
        self.wrap: list[str] = []  # a prefix for the agent's command line (a namespace to run in)
        for d in (self.root, self.bin, self.root / "releases"):
            d.mkdir(parents=True, exist_ok=True)
        self.set_gpu(gpu_spec())
        for role in ("miner", "prover"):
            (self.bin / f"{role}.py").write_text(STANDIN.read_text())

    # ------------------------------------------------------------------ the world

    def set_gpu(self, spec: GpuSpec) -> None:
        write_world(self.amdsmi_config if spec.vendor == "amd" else self.nvml_config, spec)

    def make_amd(self, rocm_dir: Path, spec: GpuSpec | None = None) -> None:
        """An AMD box: ROCm (the stand-in AMD SMI) at rocm_dir, found as the binding finds a
        real one (ROCM_PATH), reporting spec; NVML stays where it was, reporting nothing the
        AMD admission reads."""
        self.env_extra.update(ROCM_PATH=str(rocm_dir),
                              SANDBOX_AMDSMI_CONFIG=str(self.amdsmi_config))
        self.set_gpu(spec or amd_gpu_spec())

    def configure_amd(self, **top: Any) -> None:
        """configure() for an AMD box: the vendor, the amdgpu driver and ROCm it admits."""
        self.configure(**{"gpu_vendor": "amd", "admitted_driver": AMD_DRIVER,
                          "admitted_rocm": ROCM, **top})

    def set_node_state(self, **fields: Any) -> None:
        tmp = self.node_state.with_suffix(".tmp")
        tmp.write_text(json.dumps(fields))
        os.replace(tmp, self.node_state)

    def release(self, version: str) -> tuple[Path, str]:
        """A node binary (the stand-in with its own VERSION) under releases/<sha16>/node."""
        text = f"#!{PY}\n" + STANDIN.read_text().replace('VERSION = "v1"', f'VERSION = "{version}"')
        sha = hashlib.sha256(text.encode()).hexdigest()
        path = self.root / "releases" / sha[:16] / "node"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
        return path, sha

    def point(self, path: Path | str, sha: str) -> None:
        """Write standing.node.sha256, then standing.node (each replaced atomically)."""
        for name, content in (("standing.node.sha256", sha), ("standing.node", str(path))):
            tmp = self.root / f".{name}.tmp"
            tmp.write_text(content + "\n")
            os.replace(tmp, self.root / name)

    def configure(self, programs: tuple[str, ...] = ("node", "miner", "prover"),
                  program_overrides: dict[str, dict[str, Any]] | None = None,
                  sections: dict[str, dict[str, Any]] | None = None, **top: Any) -> None:
        settings: dict[str, Any] = {
            "root": str(self.root), "tick_s": 0.2, "stable_s": 1.0, "reconcile_s": 1.0,
            "result_every_s": 600, "stop_grace_s": 2.0, "backoff_base_s": 0.1,
            "backoff_cap_s": 0.8, "degraded_after": 3, "admitted_driver": DRIVER,
            "p2p_port": 16111,
        }
        settings.update(top)
        env = {"STANDIN_LOG": str(self.invocations_log)}
        defaults: dict[str, dict[str, Any]] = {
            "node": {
                "command": ["{node_bin}", "node", "--rpc-port", str(self.rpc_port), "--state",
                            str(self.node_state), "--p2p={p2p_public_ip}:{p2p_public_port}"],
                "status_url": f"http://127.0.0.1:{self.rpc_port}/status",
                "env": env,
            },
            "miner": {
                "command": f"{PY} {self.bin}/miner.py miner --status {{root}}/run/miner.json "
                           f"--pack {{root}}/pack.txt",
                "status_file": "{root}/run/miner.json",
                "needs_gpu": True,
                "env": env,
            },
            "prover": {
                "command": [PY, f"{self.bin}/prover.py", "prover", "--status",
                            "{root}/run/prover.json"],
                "status_file": "{root}/run/prover.json",
                "needs_gpu": True,
                "env": env,
            },
        }
        lines = [f"{k} = {toml_value(v)}" for k, v in settings.items()]
        for name, table in (sections or {}).items():
            lines.append(f"\n[{name}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
        for name in programs:
            table = dict(defaults[name], **(program_overrides or {}).get(name, {}))
            lines.append(f"\n[programs.{name}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
        self.config_path.write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------ the agent

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RUNPOD_", "VAST_", "PUBLIC_IPADDR"))}
        env.update(LD_LIBRARY_PATH=str(self.nvml_dir), SANDBOX_NVML_CONFIG=str(self.nvml_config))
        env.update(self.env_extra)
        return env

    def agent_cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([PY, "-m", "agent", *args], env=self.env(), capture_output=True,
                              text=True, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"agent {args} failed ({done.returncode}): {done.stderr}")
        return done

    def start_agent(self, prelude: str = "") -> subprocess.Popen[bytes]:
        """`agent run --foreground`; `prelude` (Python) runs first in the agent's process."""
        out = open(self.tmp / f"agent-{len(self.agents)}.out", "wb")
        code = f"{prelude}\nimport sys\nfrom agent.cli import main\nsys.exit(main(sys.argv[1:]))"
        agent = subprocess.Popen(
            [PY, "-c", code, "run", "--foreground", "--config", str(self.config_path)],
            env=self.env(), stdout=out, stderr=subprocess.STDOUT,
        )
        out.close()
        self.agents.append(agent)
        wait_for(lambda: self.status().get("agent", {}).get("pid") == agent.pid
                 or agent.poll() is not None, "the agent's first status")
        assert agent.poll() is None, self.agent_output()
        return agent

    def kill_agent(self, agent: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        agent.send_signal(sig)
        agent.wait(timeout=30)

    def agent_output(self) -> str:
        outs = sorted(self.tmp.glob("agent-*.out"))
        return "\n".join(p.read_text(errors="replace") for p in outs)

    def journal(self) -> str:
        path = self.root / "log" / "agent.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------------ observations

    def status(self) -> dict[str, Any]:
        try:
            return json.loads((self.root / "run" / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def program(self, name: str) -> dict[str, Any]:
        return self.status().get("programs", {}).get(name, {})

    def pid_of(self, name: str) -> int | None:
        """The pid the agent reports for a running program."""
        p = self.program(name)
        return p.get("pid") if p.get("state") == "running" else None

    def ticks(self) -> int:
        return int(self.status().get("agent", {}).get("ticks", 0))

    def wait_ticks(self, n: int) -> None:
        """Let n more ticks pass (a tick also applies observations and writes status)."""
        target = self.ticks() + n
        wait_for(lambda: self.ticks() >= target, f"{n} more agent ticks")

    def invocations(self, role: str) -> list[dict[str, Any]]:
        if not self.invocations_log.exists():
            return []
        rows = [json.loads(ln) for ln in self.invocations_log.read_text().splitlines() if ln]
        return [r for r in rows if r["role"] == role]

    def running(self, role: str) -> list[psutil.Process]:
        """Live stand-in processes of this role started from this box."""
        found = []
        for p in psutil.process_iter(["cmdline", "status"]):
            argv = p.info["cmdline"] or []
            if p.info["status"] == psutil.STATUS_ZOMBIE or len(argv) < 3:
                continue
            if argv[2] == role and str(self.tmp) in argv[1]:
                found.append(p)
        return found

    # ------------------------------------------------------------------ teardown

    def cleanup(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait(timeout=10)
        marker = str(self.tmp)
        victims = []
        for p in psutil.process_iter(["cmdline"]):
            if p.pid != os.getpid() and any(marker in a for a in p.info["cmdline"] or []):
                victims.append(p)
        for p in victims:
            try:
                os.killpg(p.pid, signal.SIGKILL) if os.getpgid(p.pid) == p.pid else p.kill()
            except (psutil.Error, ProcessLookupError, PermissionError):
                pass
        wait_for(lambda: not [p for p in victims if alive(p)], "the test's processes gone", 10)
        self._end_job_cgroups()
        shutil.rmtree(job_area(str(self.root)), ignore_errors=True)  # the jobs' work directories

    def _end_job_cgroups(self) -> None:
        """The cgroups the test's jobs recorded and no later step or stop ended (a step the
        test killed): a box's teardown stops its job, which ends them; a test may not."""
        from agent.job import cgroup

        for state in (self.root / "jobs").glob("*/state.json"):
            try:
                recorded = json.loads(state.read_text()).get("cgroups") or []
            except (OSError, ValueError, AttributeError):
                continue
            for rel in recorded:
                if cgroup.valid(rel) and cgroup.where(rel) is not None:
                    with contextlib.suppress(cgroup.CgroupError, OSError):
                        cgroup.kill(rel)
                        cgroup.remove(rel)


def alive(p: psutil.Process) -> bool:
    """Running and not a zombie (an orphaned zombie waits for PID 1, which may be slow)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def gone(pid: int) -> bool:
    """No such process any more, or only its zombie (exited, not yet reaped by its parent).
    Asked once: a process that exits between two questions is never an error."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def zombie(p: psutil.Process) -> bool:
    """An exited process its parent has not reaped (one that is gone altogether is not)."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# a prelude (`Box.start_agent(prelude=...)`) for programs that survive SIGKILL, as a process in
# uninterruptible sleep does: the agent's signals other than SIGKILL still reach them
UNKILLABLE = """
import signal
from agent.base import procs
from agent.base import stopping
real = procs.signal_program
def signal_program(pid, pgid, sig):
    if sig != signal.SIGKILL:  # a process in uninterruptible sleep: SIGKILL does not end it
        real(pid, pgid, sig)
procs.signal_program = signal_program
stopping.KILL_WAIT_S = 0.3
"""


def node_sha16(box: Box) -> str | None:
    """The running node's digest, as the agent's status names it (None: no node running)."""
    p = box.program("node")
    return p.get("sha16") if p.get("state") == "running" else None


def start_with(box: Box, version: str = "v1", **top: object) -> tuple[Path, str]:
    """The agent started on a box whose pointer names release `version`, once that node runs
    and answers: the release's (path, sha256)."""
    path, sha = box.release(version)
    box.point(path, sha)
    box.configure(**top)  # type: ignore[arg-type]
    box.start_agent()
    wait_for(lambda: node_sha16(box) == sha[:16], f"node {version} running")
    wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("version") == version,
             f"node {version} answering")
    return path, sha


# code for Box.start_agent: a writer replaces the node (RACE_SRC over RACE_DST) between the
# digest check and the exec, once RACE_TRIGGER exists
RACE = '''
import os, shutil
from agent.daemon import node_switch as _sw
_orig = _sw.NodeSwitch.spawn_refusal
def _racy(self):  # a writer lands between the digest check and the exec
    r = _orig(self)
    trig = os.environ["RACE_TRIGGER"]
    if r is None and os.path.exists(trig):
        os.unlink(trig)
        src, dst = os.environ["RACE_SRC"], os.environ["RACE_DST"]
        shutil.copyfile(src, dst + ".new"); os.chmod(dst + ".new", 0o755)
        os.replace(dst + ".new", dst)
    return r
_sw.NodeSwitch.spawn_refusal = _racy
'''
