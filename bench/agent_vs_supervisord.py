"""Restart latency, memory and idle CPU: the fleet agent beside supervisord 4.3, in one run.

Both supervise the same three stand-in programs (bench/agent/prog.c: note pid and start
time, then idle as the same process) at the same time on the same machine. Each program is
SIGKILLed only after it has been up `stable_s`; the latency is from the kill to the new
instance's own start stamp. Then both sit idle for `idle_s` while their CPU time and RSS (the
supervisor process alone, not its children) are read.

    python bench/agent_vs_supervisord.py [--kills 51] [--stable-s 10] [--idle-s 60]
                                         [--hash-release-mib 1024]

With --hash-release-mib, the pointer names a release of that size whose digest file never
matches, and the agent is kept hashing it: each time a hash ends, the file's mtime is changed
and the agent told to look (SIGUSR2), so it hashes it again once it has settled. Each of the
agent's kills waits until a hash is in progress (the agent holds the release open).

Prints a Markdown table and writes bench/out/agent_vs_supervisord.json (with a release being
hashed: agent_vs_supervisord_hashing.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import _smoke
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sandbox.backend import GpuDevice, GpuSpec  # noqa: E402
from sandbox.nvml import build_library, write_config  # noqa: E402

PROG_SOURCE = REPO / "bench" / "agent" / "prog.c"
PROGRAMS = ("node", "miner", "prover")
DRIVER = "580.95.05"
POLL_S = 0.0005
MARK = {"agent": "agent", "supervisord": "sv"}


@dataclass
class Supervised:
    """One program under one supervisor, seen through its marker file."""

    supervisor: str
    name: str
    marker: Path
    latencies: list[float] = field(default_factory=list)

    def last(self) -> tuple[int, float] | None:
        try:
            lines = self.marker.read_text().split("\n")
        except FileNotFoundError:
            return None
        lines = [ln for ln in lines if ln.strip()]
        if not lines:
            return None
        pid, started = lines[-1].split()
        return int(pid), float(started)


def wait_until(condition, what: str, timeout: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark stuck waiting for {what}")
        time.sleep(POLL_S)


def build_program(work: Path) -> Path:
    """The stand-in program, compiled for this run (gcc: ./run.sh installs it)."""
    prog = work / "prog"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(prog), str(PROG_SOURCE)], check=True)
    return prog


def setup_agent(work: Path, stable_s: float, nvml_dir: Path, prog: Path
                ) -> tuple[list[str], dict[str, str]]:
    root = work / "agent-root"
    (root / "releases").mkdir(parents=True)
    node = prog.read_bytes()
    sha = hashlib.sha256(node).hexdigest()
    binary = root / "releases" / sha[:16] / "node"
    binary.parent.mkdir()
    binary.write_bytes(node)
    binary.chmod(0o755)
    (root / "standing.node.sha256").write_text(sha + "\n")
    (root / "standing.node").write_text(f"{binary}\n")
    markers = work / "markers"
    config = f'''root = "{root}"
stable_s = {stable_s}
admitted_driver = "{DRIVER}"

[programs.node]
command = ["{{node_bin}}", "{markers}/agent-node"]
status_url = "http://127.0.0.1:9/status"

[programs.miner]
command = ["{prog}", "{markers}/agent-miner"]
needs_gpu = true
status_file = "{{root}}/run/miner.json"

[programs.prover]
command = ["{prog}", "{markers}/agent-prover"]
needs_gpu = true
status_file = "{{root}}/run/prover.json"
'''
    (root / "agent.toml").write_text(config)
    world = work / "nvml.json"
    write_config(world, GpuSpec(DRIVER, 12080, [
        GpuDevice("GPU-00000000-0000-4000-8000-000000000001", "NVIDIA H100 80GB HBM3",
                  "00000000:1B:00.0", 85899345920, "1650000000001")]))
    env = dict(os.environ, LD_LIBRARY_PATH=str(nvml_dir), SANDBOX_NVML_CONFIG=str(world))
    argv = [sys.executable, "-m", "agent", "run", "--foreground", "--config",
            str(root / "agent.toml")]
    return argv, env


def setup_supervisord(work: Path, prog: Path) -> list[str]:
    """supervisord 4.3 with its defaults (startsecs=1: every kill lands on a RUNNING
    process, so each exit is an ordinary autorestart) and process-group stopping."""
    logs = work / "supervisord"
    logs.mkdir()
    sections = [f"""[supervisord]
nodaemon=true
logfile={logs}/supervisord.log
pidfile={logs}/supervisord.pid
childlogdir={logs}
"""]
    for name in PROGRAMS:
        sections.append(f"""[program:{name}]
command={prog} {work}/markers/sv-{name}
autorestart=true
startsecs=1
stopasgroup=true
killasgroup=true
redirect_stderr=true
stdout_logfile={logs}/{name}.log
""")
    conf = logs / "supervisord.conf"
    conf.write_text("\n".join(sections))
    return [sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)]


class Hashing:
    """Keeps the agent hashing a large release the pointer names (see the module's doc)."""

    def __init__(self, root: Path, mib: int) -> None:
        self.release = root / "releases" / "big" / "node"
        self.release.parent.mkdir(parents=True)
        block = os.urandom(1 << 20)
        with open(self.release, "wb") as f:
            for _ in range(mib):
                f.write(block)
        self.release.chmod(0o755)
        self.agent_pid = 0
        self.hashes = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._drive, daemon=True)

    def point(self, root: Path, agent_pid: int) -> None:
        """Point at the release (a digest that never matches: it is never switched to)."""
        (root / "standing.node.sha256").write_text("0" * 64 + "\n")
        (root / "standing.node").write_text(f"{self.release}\n")
        self.agent_pid = agent_pid
        self._thread.start()

    def in_progress(self) -> bool:
        """Whether the agent holds the release open for longer than a look (two polls)."""
        if not self._open():
            return False
        time.sleep(0.002)
        return self._open()

    def _open(self) -> bool:
        fds = Path(f"/proc/{self.agent_pid}/fd")
        try:
            return any(os.readlink(fd) == str(self.release) for fd in fds.iterdir())
        except OSError:
            return False

    def _drive(self) -> None:
        while not self._halt.is_set():
            now = time.time_ns()
            os.utime(self.release, ns=(now, now))  # a changed file: hashed once it settles
            while not self.in_progress() and not self._halt.is_set():
                os.kill(self.agent_pid, signal.SIGUSR2)  # look at the pointer now
                self._halt.wait(0.3)
            self.hashes += 1
            while self.in_progress() and not self._halt.is_set():
                self._halt.wait(0.05)

    def stop(self) -> None:
        self._halt.set()


def kill_and_time(target: Supervised, stable_s: float, rng: random.Random,
                  hashing: Hashing | None = None) -> float:
    """Wait until the program has been up stable_s (plus a random 0.2-1.2 s, so that kills
    do not fall at one fixed phase of either supervisor's loop), SIGKILL it, time its next
    start. With `hashing`, an agent's program is killed only while the agent hashes."""
    pid, started = wait_until(target.last, f"{target.supervisor} {target.name} started")
    time.sleep(max(0.0, started + stable_s + rng.uniform(0.2, 1.2) - time.time()))
    if hashing is not None and target.supervisor == "agent":
        wait_until(hashing.in_progress, "the agent hashing the release")
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)

    def restarted() -> tuple[int, float] | None:
        last = target.last()
        return last if last and last[0] != pid else None

    _, new_start = wait_until(restarted, f"{target.supervisor} {target.name} restarted")
    return new_start - killed_at


def cpu_seconds(pid: int) -> float:
    """CPU time of a process, all its threads, children excluded, in nanosecond resolution
    (/proc/<pid>/task/*/schedstat; the clock-tick counters psutil reads are 10 ms coarse)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def machine() -> str:
    mem = psutil.virtual_memory().total / 2**30
    os_name = platform.platform()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"') + f", Linux {platform.release()}"
    except OSError:
        pass
    python = platform.python_version()
    return f"{psutil.cpu_count()} cores, {mem:.0f} GiB RAM, {os_name}, Python {python}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=51, help="SIGKILLs per supervisor (>= 50)")
    ap.add_argument("--stable-s", type=float, default=10.0,
                    help="kill only after this long up (the agent's default stable_s)")
    ap.add_argument("--idle-s", type=float, default=60.0)
    ap.add_argument("--hash-release-mib", type=int, default=0,
                    help="kill the agent's programs while it hashes a release of this size")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = _smoke.parse(ap, kills=3, stable_s=3.0, idle_s=3.0)
    out_dir = REPO / "bench" / "out"
    if not args.smoke:
        out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="agent-vs-supervisord-",
                                 dir=None if args.smoke else out_dir))
    (work / "markers").mkdir()
    nvml_dir = build_library(work / "nvml").parent
    prog = build_program(work)
    agent_argv, agent_env = setup_agent(work, args.stable_s, nvml_dir, prog)
    sv_argv = setup_supervisord(work, prog)
    root = work / "agent-root"
    hashing = Hashing(root, args.hash_release_mib) if args.hash_release_mib else None
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["agent"] = subprocess.Popen(agent_argv, env=agent_env, stdout=subprocess.DEVNULL,
                                          stderr=open(work / "agent.err", "wb"))
        procs["supervisord"] = subprocess.Popen(sv_argv, stdout=subprocess.DEVNULL,
                                                stderr=open(work / "supervisord.err", "wb"))
        targets = [Supervised(sup, name, work / "markers" / f"{MARK[sup]}-{name}")
                   for name in PROGRAMS for sup in ("agent", "supervisord")]
        for t in targets:
            wait_until(t.last, f"{t.supervisor} {t.name} first start")
        if hashing is not None:
            hashing.point(root, procs["agent"].pid)
        rounds = math.ceil(args.kills / len(PROGRAMS))
        rng = random.Random(4)
        started = time.monotonic()
        for r in range(rounds):
            for t in targets:
                if len(t.latencies) < rounds:
                    t.latencies.append(kill_and_time(t, args.stable_s, rng, hashing))
            print(f"round {r + 1}/{rounds} done ({time.monotonic() - started:.0f} s)",
                  file=sys.stderr)
        for name, p in procs.items():
            if p.poll() is not None:
                raise SystemExit(f"{name} died during the kills")
        if hashing is not None:
            hashing.stop()
            wait_until(lambda: not hashing.in_progress(), "the last hash's end")
        # idle: let both settle after the last restart, then watch them do nothing
        time.sleep(args.stable_s + 2)
        watched = {name: psutil.Process(p.pid) for name, p in procs.items()}
        before = {n: cpu_seconds(p.pid) for n, p in procs.items()}
        t0 = time.monotonic()
        time.sleep(args.idle_s)
        elapsed = time.monotonic() - t0
        after = {n: cpu_seconds(p.pid) for n, p in procs.items()}
        rss = {n: w.memory_info().rss for n, w in watched.items()}
        cpu = {n: 100.0 * (after[n] - before[n]) / elapsed for n in watched}
    finally:
        if hashing is not None:
            hashing.stop()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for name in PROGRAMS:  # the agent leaves its programs running on TERM, by design
            marker = work / "markers" / f"agent-{name}"
            if marker.exists():
                last = marker.read_text().split()
                try:
                    os.kill(int(last[-2]), signal.SIGKILL)
                except (ProcessLookupError, IndexError, ValueError):
                    pass

    figures: dict[str, dict[str, float]] = {}
    for sup in ("agent", "supervisord"):
        lat = [x for t in targets if t.supervisor == sup for x in t.latencies]
        figures[sup] = {
            "kills": len(lat),
            "restart_median_s": statistics.median(lat),
            "restart_p99_s": percentile(lat, 99),
            "restart_max_s": max(lat),
            "rss_mib": rss[sup] / 2**20,
            "idle_cpu_percent": cpu[sup],
        }
    a, s = figures["agent"], figures["supervisord"]
    ratios = {
        "restart_median_speedup": s["restart_median_s"] / a["restart_median_s"],
        "restart_p99_speedup": s["restart_p99_s"] / a["restart_p99_s"],
        "rss_agent_over_supervisord": a["rss_mib"] / s["rss_mib"],
        "cpu_agent_over_supervisord": (a["idle_cpu_percent"] / s["idle_cpu_percent"]
                                       if s["idle_cpu_percent"] else float("nan")),
    }
    command = " ".join(["python bench/agent_vs_supervisord.py", *sys.argv[1:]])
    result = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": machine(),
              "command": command, "stable_s": args.stable_s, "idle_s": args.idle_s,
              "hash_release_mib": args.hash_release_mib,
              "hashes_driven": hashing.hashes if hashing else 0, **figures, "ratios": ratios}
    name = "agent_vs_supervisord_hashing" if hashing else "agent_vs_supervisord"
    if not args.smoke:
        (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{result['date']}, {result['machine']}")
    print(f"`{command}` (stable_s {args.stable_s:g} s, idle {args.idle_s:g} s)\n")
    if hashing is not None:
        print(f"each agent kill while it hashed a {args.hash_release_mib} MiB release "
              f"({hashing.hashes} hashes driven)\n")
    print("| supervisor | kills | restart median | restart p99 | RSS | idle CPU (% of a core) |")
    print("|---|---|---|---|---|---|")
    for sup, row in figures.items():
        print(f"| {sup} | {row['kills']:.0f} | {row['restart_median_s'] * 1000:.1f} ms | "
              f"{row['restart_p99_s'] * 1000:.1f} ms | {row['rss_mib']:.1f} MiB | "
              f"{row['idle_cpu_percent']:.3f} % |")
    print(f"\nagent vs supervisord: restart median {ratios['restart_median_speedup']:.0f}x "
          f"faster, p99 {ratios['restart_p99_speedup']:.0f}x faster; "
          f"RSS {ratios['rss_agent_over_supervisord']:.2f}x, "
          f"idle CPU {ratios['cpu_agent_over_supervisord']:.2f}x supervisord's")
    if args.keep:
        print(f"\nwork directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
