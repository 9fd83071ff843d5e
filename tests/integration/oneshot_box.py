"""The one-shot sandbox the integration tests share: a sandbox with the Hub-compatible store,
the example toolchain pushed, and the `fleet` CLI pointed at both (`OneShot`), plus readers of
the archive's and the store's copies of a job's outputs."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import REPO, FleetCli, workspace

from fleet.core.boxes import Row
from fleet.state.registry import Registry
from sandbox import fleet_toml, manage
from sandbox.control_client import ControlClient

EXAMPLE = REPO / "examples" / "bench"
UNQUALIFIED = "GPU-00000000-0000-4000-8000-000000000000"

ROLES = fleet_toml.BENCH_ROLE + """\
banned_symbols = ["cublas*", "*softmax*", "*tanh*", "*matrixmultiply*"]
[roles.qualified]
kind = "oneshot"
image = "img"
disk_gb = 20
admitted_driver = "580.95.05"
qualified_gpus = ["{unqualified}"]
"""


class OneShot(FleetCli):
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        super().__init__(tmp, env)
        self.sandbox = tmp / "sandbox"
        self.revision = ""

    @property
    def registry(self) -> Registry:
        return Registry(self.tmp / "state" / "boxes.json")

    def rows(self) -> dict[str, Row]:
        return {r.label: r for r in self.registry.rows()}

    def control(self) -> ControlClient:
        return ControlClient.from_state_dir(self.sandbox)

    def listed(self, row: Row) -> bool:
        """Does the sandbox's provider still list the box?"""
        with self.control() as c:
            return any(i["id"] == row.provider_id for i in c.instances()
                       if i.get("phase") != "destroyed")

    def job(self, name: str, **changes: Any) -> Path:
        """A copy of the example job under `name`, with changed keys (TOML lines)."""
        d = self.tmp / "jobs" / name
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(EXAMPLE / "inputs", d / "inputs")
        lines = {"name": f'"{name}"', "command": '"python3 run.py"', "outputs": '"out"',
                 "ttl_minutes": "30", "inputs": '"inputs"',
                 "modules": '["toolchain/kernels/*.ptx"]', "provider": '"vast"'}
        lines.update({k: v for k, v in changes.items() if not k.startswith("_")})
        text = "".join(f"{k} = {v}\n" for k, v in lines.items() if v is not None)
        text += (f'[toolchain]\nrepo = "fleet/toolchains"\nrevision = "{self.revision}"\n'
                 'path = "toolchain"\n')
        text += changes.get("_gates", '[[gates]]\nname = "parity"\n'
                                      'command = "python3 parity.py"\nmin_passed = 4\n')
        (d / "job.toml").write_text(text)
        return d / "job.toml"

    def run_job(self, role: str, job: Path, *extra: str) -> tuple[int, dict[str, Any]]:
        r = self.fleet("run", role, str(job), "--json", *extra, check=False)
        try:
            return r.returncode, json.loads(r.stdout)
        except ValueError:
            raise AssertionError(f"fleet run printed no JSON ({r.returncode}):\n{r.stdout}\n"
                                 f"{r.stderr[-4000:]}") from None

    def ssh(self, row: Row, command: str) -> str:
        from fleet.boxes import boxssh
        from fleet.core.config import load

        res = boxssh.run(load(self.tmp / "fleet.toml"), row, command)
        assert res.returncode == 0, res.stderr
        return res.stdout

    def store_files(self, commit: str, prefix: str) -> dict[str, bytes]:
        """The store's copy at `commit`, downloaded afresh through huggingface_hub."""
        code = (
            "import json, sys, tempfile, huggingface_hub as h\n"
            "repo, commit, prefix = sys.argv[1:4]\n"
            "d = h.snapshot_download(repo, repo_type='dataset', revision=commit,\n"
            "    cache_dir=tempfile.mkdtemp(), allow_patterns=[prefix + '/*', prefix + '/**'])\n"
            "print(d)\n")
        r = self.run(sys.executable, "-c", code, "fleet/outputs", commit, prefix)
        root = Path(r.stdout.strip().splitlines()[-1]) / prefix
        return {p.relative_to(root).as_posix(): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file()}


def oneshot_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneShot]:
    """Up for a test module (a module-scoped fixture yields from it), down after."""
    tmp, env = workspace(tmp_path_factory, "oneshot", lambda state: fleet_toml.render(
        state, store=True, roles=ROLES.format(unqualified=UNQUALIFIED)))
    env["HF_HOME"] = str(tmp / "hf-home")
    f = OneShot(tmp, env)
    try:
        f.fleet("sandbox", "up", "--boxes", "0", "--backend", "ns")
        env.update(manage.load_env(f.sandbox))
        pushed = f.fleet("store", "push", str(EXAMPLE / "toolchain"), "--repo",
                         "fleet/toolchains")
        f.revision = json.loads(pushed.stdout)["revision"]
        # the example job pins the commit a fresh store gives this push (README's steps)
        assert f'revision = "{f.revision}"' in (EXAMPLE / "job.toml").read_text()
        yield f
    finally:
        f.fleet("sandbox", "down", check=False)


def archive_copy(fleet: OneShot, label: str, job: str) -> dict[str, bytes]:
    """The archive's copy of a job's outputs (the fleet's manifest lies beside them)."""
    root = fleet.tmp / "state" / "archive" / label / job / "outputs"
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def archived_manifest(fleet: OneShot, label: str, job: str) -> Any:
    return json.loads((fleet.tmp / "state" / "archive" / label / job /
                       "fleet-manifest.json").read_text())


def stored_outputs(fleet: OneShot, commit: str, prefix: str) -> tuple[dict[str, bytes], Any]:
    """The store's copy at `commit`: the outputs, and the fleet's manifest beside them."""
    files = fleet.store_files(commit, prefix)
    manifest = json.loads(files.pop("fleet-manifest.json"))
    assert all(p.startswith("outputs/") for p in files), sorted(files)
    return {p.removeprefix("outputs/"): b for p, b in files.items()}, manifest


def manifest_of(files: dict[str, bytes]) -> dict[str, str]:
    return {p: hashlib.sha256(b).hexdigest() for p, b in files.items()}
