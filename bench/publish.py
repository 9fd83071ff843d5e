"""Publishing 1.5.0 over 1.4.0 on 1 and 8 sandbox boxes: node downtime, wall time, SSH requests.

    .venv/bin/python bench/publish.py [--sizes 1 8] [--stable-s 5] [--smoke]   (root: sandbox boxes)

For each size: a fresh sandbox (namespaced SSH hosts), boxes rented on both fake providers and
converted with release 1.4.0, then `fleet publish 1.5.0 --waves rest --soak 0` (one wave) and
the same command again (no change). Per run: wall time and the SSH requests each box's sshd
received (its own log at LogLevel VERBOSE: every exec'd command and every sftp start is one
request; counted box-side, as bench/standing_convert.py does).

Node downtime is measured on each box by a sampler that asks the node's status RPC every 20 ms,
started only after those two runs (it costs the shared cores): a publish of 1.4.0 back over
1.5.0 (`--allow-downgrade` every box: a switch like any other), from the last synced answer of
the old node to the first synced answer of the new one; then a plain restart of the same binary
on the same boxes (the node SIGKILLed on every box at once; the agent starts it again), from the
last synced answer before the kill to the first one after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _smoke

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO))

from bench.standing_convert import config, requests_per_box  # noqa: E402

ROOT = "/root/fleet"
# Box-side sampler: one line per change of what the node's RPC answers (or "down").
SAMPLER = r"""
import json, sys, time, urllib.request
end = time.time() + float(sys.argv[1])
last = None
with open(sys.argv[2], "w") as f:
    while time.time() < end:
        try:
            with urllib.request.urlopen("http://127.0.0.1:16110/status", timeout=0.5) as r:
                s = json.load(r)
            now = "%s:%s" % (s.get("version"), "synced" if s.get("synced") else "syncing")
        except Exception:
            now = "down"
        t = time.time()
        if now != last:
            f.write(json.dumps([t, now]) + "\n"); f.flush()
            last = now
        else:
            f.write("")
        time.sleep(0.02)
    f.write(json.dumps([time.time(), "end"]) + "\n")
"""


def downtime(samples: list[tuple[float, str]], old: str, new: str,
             after: float) -> float | None:
    """Seconds the node was not answering synced around an event at `after`: from the end of
    the old node's synced answers to the first synced answer of the new one.

    `samples` are the sampler's changes: each state holds until the next sample's time.
    """
    segs = [(t, samples[i + 1][0] if i + 1 < len(samples) else t, what)
            for i, (t, what) in enumerate(samples)]
    if old == new:  # a restart: the synced stretch the event cut short
        cut = [s for s in segs if s[2] == f"{old}:synced" and s[0] <= after]
        if not cut:
            return None
        gone = cut[-1][1]
    else:  # a switch: the old node's last synced stretch before the new one's first
        first = next((s for s in segs if s[2] == f"{new}:synced" and s[0] >= after), None)
        if first is None:
            return None
        ends = [s[1] for s in segs if s[2] == f"{old}:synced" and s[1] <= first[0]]
        if not ends:
            return None
        gone = max(ends)
    back = next((s[0] for s in segs if s[2] == f"{new}:synced" and s[0] >= gone), None)
    return None if back is None else round(back - gone, 3)


class Bench:
    def __init__(self, base: Path, n: int) -> None:
        self.base = base
        self.n = n
        self.sandbox = base / "sandbox"
        (base / "fleet.toml").write_text(config(base / "state"))
        self.env = {**os.environ, "FLEET_CONFIG": str(base / "fleet.toml"),
                    "FLEET_SANDBOX_DIR": str(self.sandbox), "PYINFRA_PROGRESS": "off",
                    "COLUMNS": "250", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(list(argv), cwd=REPO, env=self.env, capture_output=True, text=True,
                           timeout=1200)
        if check and r.returncode != 0:
            raise SystemExit(f"{argv} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        return r

    def up(self) -> list[str]:
        self.run(str(BIN / "fleet"), "sandbox", "up", "--boxes", str(self.n), "--backend", "ns")
        for line in (self.sandbox / "env").read_text().splitlines():
            if line.startswith("export "):
                k, _, v = line[7:].partition("=")
                self.env[k] = v.strip("'")
        deploy = [str(BIN / "pyinfra"), "-y", "inventory.py", "deploys/standing.py"]
        self.run(*deploy)
        roster = json.loads(self.run(str(BIN / "fleet"), "roster", "--json").stdout)
        labels = sorted(b["label"] for b in roster["boxes"])
        for label in labels:
            self.wait_synced(label, "1.4.0")
        return labels

    def ssh(self, label: str, command: str) -> str:
        import base64

        import paramiko

        from fleet.state.registry import Registry

        row = Registry(self.base / "state" / "boxes.json").get(label)
        assert row is not None and row.host_key and row.ssh_host and row.ssh_port
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.get_host_keys().add(f"[{row.ssh_host}]:{row.ssh_port}", "ssh-ed25519",
                                   paramiko.Ed25519Key(data=base64.b64decode(
                                       row.host_key.split()[1])))
        client.connect(row.ssh_host, row.ssh_port, "root",
                       key_filename=str(self.base / "state" / "ssh" / "fleet"),
                       look_for_keys=False, allow_agent=False, timeout=15)
        try:
            _, out, _ = client.exec_command(command, timeout=60)
            return str(out.read().decode())
        finally:
            client.close()

    def readback(self, label: str) -> dict[str, Any]:
        out = self.ssh(label, f"cd {ROOT} && venv/bin/python -m agent readback")
        data: dict[str, Any] = json.loads(out)
        return data

    def wait_synced(self, label: str, version: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node = self.readback(label).get("node") or {}
            if node.get("version") == version and node.get("synced"):
                return node
            time.sleep(0.5)
        raise SystemExit(f"{label}: node {version} not synced within {timeout:g} s")

    def start_samplers(self, labels: list[str], seconds: float) -> None:
        from concurrent.futures import ThreadPoolExecutor

        cmd = (f"cat > /tmp/sampler.py <<'EOF'\n{SAMPLER}EOF\n"
               f"nohup python3 /tmp/sampler.py {seconds} /tmp/samples.log >/dev/null 2>&1 &")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda x: self.ssh(x, cmd), labels))
        time.sleep(0.5)  # the samplers' first reading (they run on their own from here)

    def samples(self, label: str) -> list[tuple[float, str]]:
        text = self.ssh(label, "pkill -f '/tmp/[s]ampler.py'; cat /tmp/samples.log")
        return [tuple(json.loads(line)) for line in text.splitlines()  # type: ignore[misc]
                if line.startswith("[")]

    def down(self) -> None:
        subprocess.run([str(BIN / "fleet"), "sandbox", "down"], cwd=REPO, env=self.env,
                       capture_output=True, timeout=600)


def one_size(n: int, stable_s: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleet-bench-publish-") as tmp:
        b = Bench(Path(tmp), n)
        try:
            labels = b.up()
            # wall time and requests first, with nothing of the benchmark's own running on the
            # boxes (they share this machine's cores with the operator)
            publish = [str(BIN / "fleet"), "publish", "1.5.0", "--waves", "rest", "--soak", "0",
                       "--stable-s", str(stable_s), "--deadline-s", "180", "--json"]
            runs: dict[str, Any] = {}
            for name in ("publish", "rerun"):
                seen = requests_per_box(b.sandbox)
                t0 = time.time()
                r = b.run(*publish)
                wall = time.time() - t0
                now = requests_per_box(b.sandbox)
                per_box = [now[x] - seen.get(x, 0) for x in now]
                data = json.loads(r.stdout)
                runs[name] = {"wall_s": round(wall, 2), "requests_per_box": per_box,
                              "requests_per_box_max": max(per_box),
                              "switched": len(data["switched_now"])}
            # node downtime during a switch, sampled box-side: 1.5.0 back to 1.4.0 (a switch
            # like any other; --allow-downgrade names every box)
            b.start_samplers(labels, 600)
            back = [str(BIN / "fleet"), "publish", "1.4.0", "--waves", "rest", "--stable-s",
                    str(stable_s), "--deadline-s", "180", "--json"]
            for x in labels:
                back += ["--allow-downgrade", x]
            t_switch = time.time()
            b.run(*back)
            switch_down = {x: downtime(b.samples(x), "1.5.0", "1.4.0", t_switch)
                           for x in labels}
            # a plain restart of the same binary on the same box: SIGKILL the node, on every
            # box at once as a wave switches its boxes at once
            from concurrent.futures import ThreadPoolExecutor

            b.start_samplers(labels, 120)
            pids = {x: (b.readback(x).get("node") or {}).get("pid") for x in labels}
            t_kill = {x: time.time() for x in labels}
            with ThreadPoolExecutor(len(labels)) as pool:
                list(pool.map(lambda x: b.ssh(x, f"sleep 1; kill -KILL {pids[x]}"), labels))
            t_kill = {x: t + 1.0 for x, t in t_kill.items()}
            for x in labels:
                b.wait_synced(x, "1.4.0")
            time.sleep(1.0)
            restart_down = {x: downtime(b.samples(x), "1.4.0", "1.4.0", t_kill[x])
                            for x in labels}
            return {"boxes": n, **runs, "switch_downtime_s": switch_down,
                    "restart_downtime_s": restart_down}
        finally:
            b.down()


def _stats(values: list[float | None]) -> tuple[float, float]:
    v = [x for x in values if x is not None]
    return (round(statistics.median(v), 3), round(max(v), 3)) if v else (float("nan"),) * 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--stable-s", type=int, default=5)
    args = _smoke.parse(ap, sizes=[1], stable_s=1)
    results = [one_size(n, args.stable_s) for n in args.sizes]
    out = {"date": datetime.now(UTC).date().isoformat(),
           "machine": f"{os.cpu_count()} cores, {platform.platform()}",
           "command": "bench/publish.py " + " ".join(sys.argv[1:]), "results": results}
    if not args.smoke:
        (REPO / "bench" / "out").mkdir(exist_ok=True)
        (REPO / "bench" / "out" / "publish.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    print("\n| boxes | run | wall s | SSH requests per box (max) | boxes switched |")
    print("|---|---|---|---|---|")
    for r in results:
        for name in ("publish", "rerun"):
            x = r[name]
            print(f"| {r['boxes']} | {name} | {x['wall_s']} | {x['requests_per_box_max']} | "
                  f"{x['switched']} |")
    print("\n| boxes | node downtime, switch: median / max s | plain restart: median / max s |")
    print("|---|---|---|")
    for r in results:
        sw = _stats(list(r["switch_downtime_s"].values()))
        rs = _stats(list(r["restart_downtime_s"].values()))
        print(f"| {r['boxes']} | {sw[0]} / {sw[1]} | {rs[0]} / {rs[1]} |")


if __name__ == "__main__":
    main()
