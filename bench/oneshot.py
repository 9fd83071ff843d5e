"""One-shot boxes: cold against warm toolchain, and the teardown of 1 GiB of outputs.

    .venv/bin/python bench/oneshot.py [--toolchain-mib 256] [--outputs-mib 1024] [--smoke]   (root)

A fresh sandbox (namespaced SSH hosts, the fake providers, the Hub-compatible store), then:

1. Toolchain: a synthetic toolchain of random bytes is pushed to the store; one box is rented
   and `deploys/oneshot.py` runs two jobs on it that pin that commit. Per job: the deploy's wall
   time and what the box's fetch recorded in the job's state.json (bytes fetched, seconds,
   warm). The second job on the box should fetch nothing. Each job is read back before the
   next is given (`fleet teardown LABEL --keep-box`, as the product requires: a box holding a
   job not read back is refused another), the last by `fleet teardown LABEL`; each
   teardown's wall time is recorded too.
2. Teardown: `fleet run --keep` of a job that writes 1 GiB of random outputs (4 files), then
   `fleet.ops.teardown.teardown` in this process, timed per step, with every sha256/sha1 object in
   this process counted (bytes hashed, by the module that made it): each local copy (the
   archive written from the tar stream, the store's copy downloaded afresh) should be hashed
   once. The box's copy is hashed once on the box by `python -m agent manifest`. The floor is
   `sha256sum` over the same bytes (the archive's files) once on this machine, best of 3.

`--smoke`: 8 MiB of toolchain and 32 MiB of outputs, about a minute: checks the benchmark still
runs end to end (its figures mean nothing at that size).
"""

from __future__ import annotations

# Count hashing before anything imports hashlib's constructors by name.
import collections
import hashlib
import sys
from typing import Any

HASHED: collections.Counter[str] = collections.Counter()
_REAL = {"sha256": hashlib.sha256, "sha1": hashlib.sha1}
_REAL_NEW = hashlib.new


class _Counted:
    def __init__(self, algo: str, who: str, data: Any = b"", **kw: Any) -> None:
        self._h = _REAL[algo](**kw)
        self._who = f"{who} {algo}"
        if data:
            self.update(data)

    def update(self, data: Any) -> None:
        HASHED[self._who] += memoryview(data).nbytes
        self._h.update(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._h, name)


def _maker(algo: str) -> Any:
    def make(*args: Any, **kw: Any) -> _Counted:
        return _Counted(algo, sys._getframe(1).f_globals.get("__name__", "?"), *args, **kw)
    return make


def _new(name: str, *args: Any, **kw: Any) -> Any:
    if name.lower() in _REAL:
        return _Counted(name.lower(), sys._getframe(1).f_globals.get("__name__", "?"),
                        *args, **kw)
    return _REAL_NEW(name, *args, **kw)


hashlib.sha256, hashlib.sha1, hashlib.new = _maker("sha256"), _maker("sha1"), _new  # type: ignore[assignment]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402

import _smoke  # noqa: E402

from sandbox import fleet_toml  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MIB = 1 << 20
OUTPUT_FILES = 4
# writes N files of random bytes into out/, 8 MiB at a time
WRITE_OUTPUTS = ("python3 -c \"import os; os.makedirs('out', exist_ok=True)\n"
                 "for i in range({files}):\n"
                 "    with open(f'out/part-{{i}}.bin', 'wb') as f:\n"
                 "        [f.write(os.urandom(8 << 20)) for _ in range({chunks})]\"")


def sh(argv: list[str], env: dict[str, str], timeout: float = 1800) -> str:
    r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"{argv} failed ({r.returncode}):\n{r.stdout[-3000:]}\n"
                         f"{r.stderr[-3000:]}")
    return r.stdout


def write_job(path: Path, name: str, command: str, toolchain: str | None) -> Path:
    text = (f'name = "{name}"\ncommand = {json.dumps(command)}\noutputs = "out"\n'
            'ttl_minutes = 60\nprovider = "vast"\n')
    if toolchain:
        text += (f'[toolchain]\nrepo = "fleet/toolchains"\nrevision = "{toolchain}"\n'
                 'path = "toolchain"\n')
    path.mkdir(parents=True, exist_ok=True)
    (path / "job.toml").write_text(text)
    return path / "job.toml"


def toolchain_bench(base: Path, env: dict[str, str], mib: int) -> list[dict[str, Any]]:
    from fleet.boxes import boxssh
    from fleet.core.config import load
    from fleet.state.registry import Registry

    src = base / "toolchain-src"
    (src / "lib").mkdir(parents=True)
    for i in range(8):  # eight files of random bytes: nothing compresses
        (src / "lib" / f"part-{i}.so").write_bytes(os.urandom(mib * MIB // 8))
    (src / "VERSION").write_text("bench\n")
    revision = json.loads(sh([str(BIN / "fleet"), "store", "push", str(src), "--repo",
                              "fleet/toolchains"], env))["revision"]
    label = json.loads(sh([str(BIN / "fleet"), "rent", "bench", "--provider", "vast",
                           "--json"], env))["label"]
    cfg = load(base / "fleet.toml")
    row = {r.label: r for r in Registry(base / "state" / "boxes.json").rows()}[label]
    out = []
    for name, keep in (("cold", ["--keep-box"]), ("warm", [])):
        job = write_job(base / "jobs" / name, name, "ls toolchain/lib > /dev/null", revision)
        t0 = time.perf_counter()
        sh([str(BIN / "pyinfra"), "-y", "--limit", label, "inventory.py", "deploys/oneshot.py",
            "--data", f"job={job}"], env)
        wall = time.perf_counter() - t0
        res = boxssh.run(cfg, row, f"cat /root/fleet/jobs/{name}/state.json")
        tc = json.loads(res.stdout)["toolchain"]
        # read the job back before the box is given another (kept), the last one destroys it
        t0 = time.perf_counter()
        sh([str(BIN / "fleet"), "teardown", label, *keep], env)
        torn = time.perf_counter() - t0
        out.append({"job": name, "deploy_wall_s": round(wall, 2),
                    "bytes_fetched": tc["bytes_fetched"], "fetch_s": tc["seconds"],
                    "warm": tc["warm"], "files": tc["files"],
                    "box": "kept" if keep else "destroyed",
                    "teardown_wall_s": round(torn, 2)})
    after = Registry(base / "state" / "boxes.json").get(label)
    assert after is not None and after.status == "destroyed", after
    return out


def sha256sum_floor(files: list[Path]) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(["sha256sum", *map(str, files)], check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


def teardown_bench(base: Path, env: dict[str, str], mib: int) -> dict[str, Any]:
    from fleet.core.config import load
    from fleet.ops import teardown
    from fleet.providers.factory import all_providers
    from fleet.state.registry import Registry

    command = WRITE_OUTPUTS.format(files=OUTPUT_FILES, chunks=mib // OUTPUT_FILES // 8)
    job = write_job(base / "jobs" / "big", "big", command, None)
    summary = json.loads(sh([str(BIN / "fleet"), "run", "bench", str(job), "--keep",
                             "--json"], env))
    label = summary["label"]
    steps: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                steps[name] = round(steps.get(name, 0.0) + time.perf_counter() - t0, 2)
        return wrapper

    from fleet.providers import store
    from fleet.state import archive
    teardown._remote_job = timed("the job's state from the box (ssh)", teardown._remote_job)
    teardown._pull = timed("pull to the archive (tar over ssh, hashed)", teardown._pull)
    store.push = timed("push to the store (one commit)", store.push)
    store.read_back = timed("read back from the store (fresh download, hashed)",
                            store.read_back)
    teardown._unchanged = timed("unchanged since read, on the box (ssh, sizes and mtimes)",
                                teardown._unchanged)
    archive.make_durable = timed("archive fsynced", archive.make_durable)
    HASHED.clear()
    reg = Registry(base / "state" / "boxes.json")
    busy0 = busy_cpu_s()
    t0 = time.perf_counter()
    outcome = teardown.teardown(load(base / "fleet.toml"), reg, dict(all_providers()), label)
    wall = time.perf_counter() - t0
    busy = busy_cpu_s() - busy0
    assert outcome.destroyed and outcome.commit, outcome
    total = outcome.bytes
    archived = sorted((base / "state" / "archive" / label / "big" / "outputs").glob("part-*.bin"))
    assert sum(p.stat().st_size for p in archived) == mib * MIB, archived
    floor = sha256sum_floor(archived)
    hashed = {who: n for who, n in HASHED.items() if n}
    return {"label": label, "files": outcome.files, "bytes": total, "wall_s": round(wall, 2),
            "steps_s": steps, "bytes_hashed_here": hashed,
            "times_each_byte_hashed_here": round(sum(hashed.values()) / total, 3),
            "sha256sum_floor_s": round(floor, 2), "ratio_to_floor": round(wall / floor, 2),
            # every process on the machine (box, sshd, ssh, the store, this one): the wall
            # time can be no shorter than this CPU time spread over all cores
            "cpu_s_all_processes": round(busy, 2),
            "wall_floor_from_cpu_s": round(busy / (os.cpu_count() or 1), 2)}


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle or waiting on I/O)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--toolchain-mib", type=int, default=256)
    ap.add_argument("--outputs-mib", type=int, default=1024)
    args = _smoke.parse(ap, toolchain_mib=8, outputs_mib=32)
    if os.geteuid() != 0:
        raise SystemExit("sandbox boxes need root (namespaces)")
    from sandbox import manage

    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        base = Path(tmp)
        (base / "fleet.toml").write_text(fleet_toml.render(base / "state", store=True,
                                       roles=fleet_toml.BENCH_ROLE))
        env = {**os.environ, "FLEET_CONFIG": str(base / "fleet.toml"),
               "FLEET_SANDBOX_DIR": str(base / "sandbox"), "PYINFRA_PROGRESS": "off",
               "HF_HOME": str(base / "hf-home"), "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        try:
            sh([str(BIN / "fleet"), "sandbox", "up", "--boxes", "0", "--backend", "ns"], env)
            env.update(manage.load_env(base / "sandbox"))
            os.environ.update(env)  # the in-process teardown reads the same settings
            toolchain = toolchain_bench(base, env, args.toolchain_mib)
            torn = teardown_bench(base, env, args.outputs_mib)
        finally:
            subprocess.run([str(BIN / "fleet"), "sandbox", "down"], cwd=REPO, env=env,
                           capture_output=True, timeout=600)
    print(json.dumps({"date": datetime.now(UTC).date().isoformat(),
                      "machine": f"{os.cpu_count()} cores, {platform.platform()}",
                      "toolchain_mib": args.toolchain_mib, "toolchain": toolchain,
                      "teardown": torn}, indent=1))


if __name__ == "__main__":
    main()
