"""One-shot boxes end to end in the sandbox: real boxes (SSH hosts), the real deploy and agent,
the sandbox's Hub-compatible store through the real huggingface_hub, the real providers' fakes.

Each test rents its own box through `fleet run` (or the pyinfra deploy by hand) and ends with
it destroyed or deliberately kept; no test depends on another's box.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_cli import BIN, REPO, FleetCli, wait_for, workspace

from fleet.registry import Registry, Row
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
        from fleet import boxssh
        from fleet.config import load

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


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneShot]:
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


@pytest.fixture(autouse=True)
def no_faults(fleet: OneShot) -> None:
    with fleet.control() as c:
        c.clear_faults()


def _archive(fleet: OneShot, label: str, job: str) -> dict[str, bytes]:
    root = fleet.tmp / "state" / "archive" / label / job
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _manifest_of(files: dict[str, bytes]) -> dict[str, str]:
    return {p: hashlib.sha256(b).hexdigest() for p, b in files.items()}


def test_the_happy_path_ends_with_the_box_gone_and_both_copies_equal(fleet: OneShot) -> None:
    job = fleet.job("happy")
    rc, s = fleet.run_job("bench", job)
    assert rc == 0, s
    assert s["verdict"] == "ran" and s["invocations"] == 1 and s["exit_code"] == 0, s
    assert s["admission"].startswith("driver 580.95.05"), s
    assert s["toolchain"]["bytes_fetched"] > 0 and not s["toolchain"]["warm"], s
    assert s["gates"][0]["passed"] == 5, s
    assert s["destroyed"] and s["store_commit"], s
    row = fleet.rows()[s["label"]]
    assert row.status == "destroyed" and row.store_commit == s["store_commit"]
    assert row.job == "happy" and row.invocations == 1 and row.refusal is None
    assert not fleet.listed(row)
    archived = _archive(fleet, row.label, "happy")
    manifest = json.loads(archived.pop("fleet-manifest.json"))
    assert {e["path"]: e["sha256"] for e in manifest} == _manifest_of(archived)
    assert {"results.json", "samples.bin", "fleet-job.json"} <= set(archived)
    assert json.loads(archived["fleet-job.json"])["invocations"] == 1
    stored = fleet.store_files(s["store_commit"], f"happy/{row.label}")
    assert json.loads(stored.pop("fleet-manifest.json")) == manifest
    assert stored == archived


@pytest.mark.parametrize("driver", ["580.105.08", "595.71.05"])
def test_a_wrong_driver_is_refused_before_anything_runs(fleet: OneShot, driver: str) -> None:
    name = f"drift-{driver.split('.')[0]}"
    # the next RunPod box (RunPod shows no driver before renting) comes up with NVML
    # reporting this driver; its machine stays drifted, so every other test rents on Vast
    fleet.fleet("sandbox", "fault", "driver_drift", "runpod", "--driver", driver)
    rc, s = fleet.run_job("bench", fleet.job(name, provider='"runpod"'))
    assert rc == 3, s
    assert s["invocations"] == 0 and s["refusal"].startswith("gpu: driver " + driver), s
    _refused_and_torn_down(fleet, s, name)


def test_the_right_driver_on_an_unqualified_gpu_is_refused(fleet: OneShot) -> None:
    rc, s = fleet.run_job("qualified", fleet.job("unqualified"))
    assert rc == 3, s
    assert s["invocations"] == 0 and "not among the qualified GPUs" in s["refusal"], s
    _refused_and_torn_down(fleet, s, "unqualified")


def _refused_and_torn_down(fleet: OneShot, s: dict[str, Any], job: str) -> None:
    """Zero invocations everywhere, nothing fetched or run, the box gone, nothing lost."""
    assert s["verdict"].startswith("refused") and s["destroyed"], s
    row = fleet.rows()[s["label"]]
    assert row.invocations == 0 and row.refusal == s["refusal"] and row.job_state == "refused"
    assert row.status == "destroyed" and not fleet.listed(row)
    archived = _archive(fleet, row.label, job)
    record = json.loads(archived["fleet-job.json"])
    assert record["invocations"] == 0 and record["refused"]
    # the job's own outputs never appeared: it did not run
    assert "results.json" not in archived and "samples.bin" not in archived
    roster = fleet.fleet("roster", "--all").stdout
    assert "REFUSED" in roster and "0 invocations" in roster


def test_a_banned_symbol_in_a_shipped_module_is_refused(fleet: OneShot) -> None:
    job = fleet.job("banned", modules='["toolchain/kernels/*.ptx", "lib/*.so"]')
    lib = job.parent / "inputs" / "lib"
    lib.mkdir()
    src = lib / "gemm.c"
    src.write_text("float cublasSgemm_v2(float a) { return a * 2.0f; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / "libgemm.so"), str(src)],
                   check=True)
    rc, s = fleet.run_job("bench", job)
    assert rc == 3, s
    assert s["refusal"].startswith("scan:") and "cublasSgemm_v2" in s["refusal"], s
    assert s["invocations"] == 0 and s["destroyed"], s


def test_a_failing_gate_is_refused(fleet: OneShot) -> None:
    gates = '[[gates]]\nname = "parity"\ncommand = "python3 parity.py"\nmin_passed = 9\n'
    rc, s = fleet.run_job("bench", fleet.job("gated", _gates=gates))
    assert rc == 3, s
    assert s["refusal"].startswith("gates:") and "parity" in s["refusal"], s
    assert s["invocations"] == 0 and s["destroyed"], s


def test_the_deploy_by_hand_twice_then_the_checks_then_teardown(fleet: OneShot) -> None:
    """`fleet rent`, then the pyinfra deploy run twice (the second changes nothing), then
    tests/infra, then the teardown deploy."""
    rented = json.loads(fleet.fleet("rent", "bench", "--provider", "vast", "--json").stdout)
    label = rented["label"]
    job = fleet.job("byhand")
    argv = [str(BIN / "pyinfra"), "-y", "--limit", label, "inventory.py",
            "deploys/oneshot.py", "--data", f"job={job}"]
    first = fleet.run(*argv)
    assert "Job run" in first.stdout + first.stderr  # pyinfra reports on stderr
    second = fleet.run(*argv)
    said = second.stdout + second.stderr
    total = next(line for line in said.splitlines() if "Grand total" in line).split()
    # Grand total <ops> <success> <error> <no change>: nothing changed, nothing failed
    assert total[3:5] == ["-", "-"], said[-3000:]
    infra = fleet.run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "tests/infra/test_oneshot.py", check=False)
    assert infra.returncode == 0, infra.stdout[-4000:]
    row = fleet.rows()[label]
    assert row.job == "byhand" and row.expires_at
    dry = json.loads(fleet.fleet("teardown", label, "--dry-run", "--json").stdout)
    steps = dry["torn_down"][0]["steps"]
    assert any("would destroy" in s for s in steps), dry
    assert fleet.listed(fleet.rows()[label])
    # the teardown deploy is the same read-back as `fleet teardown`
    fleet.run(str(BIN / "pyinfra"), "-y", "--limit", label, "inventory.py",
              "deploys/teardown.py")
    done = fleet.rows()[label]
    assert done.status == "destroyed" and done.store_commit and not fleet.listed(done)
    assert _archive(fleet, label, "byhand")


def _kept_run(fleet: OneShot, name: str) -> Row:
    rc, s = fleet.run_job("bench", fleet.job(name), "--keep")
    assert rc == 0 and not s["destroyed"], s
    return fleet.rows()[s["label"]]


def test_an_output_written_after_it_was_read_keeps_the_box(fleet: OneShot,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from fleet import teardown
    from fleet.config import load
    from fleet.errors import FleetError
    from fleet.providers import all_providers

    row = _kept_run(fleet, "changed")
    real = teardown._pull

    def then_changed(cfg: Any, r: Row, outputs: str, job: str) -> Any:
        pulled = real(cfg, r, outputs, job)
        fleet.ssh(r, f"echo late >> {outputs}/results.json")  # a straggler writes on
        return pulled

    monkeypatch.setattr(teardown, "_pull", then_changed)
    for k, v in fleet.env.items():  # the sandbox's providers and store, in this process
        monkeypatch.setenv(k, v)
    cfg = load(fleet.tmp / "fleet.toml")
    with pytest.raises(FleetError) as kept:
        teardown.teardown(cfg, fleet.registry, dict(all_providers()), row.label)
    assert "results.json" in str(kept.value) and "box kept" in str(kept.value)
    after = fleet.rows()[row.label]
    assert after.live and after.teardown and "results.json" in after.teardown
    assert fleet.listed(after)
    check = fleet.fleet("check", "--json", check=False)
    assert check.returncode == 1
    flagged = {h["label"]: h for h in json.loads(check.stdout)}[row.label]
    assert any("results.json" in p for p in flagged["problems"]), flagged
    assert after.store_commit is None  # the stale copy's commit is not the job's
    monkeypatch.setattr(teardown, "_pull", real)
    fleet.fleet("teardown", row.label)  # nothing changes on the box now: read back, destroyed
    done = fleet.rows()[row.label]
    assert done.status == "destroyed" and done.store_commit
    assert b"late" in fleet.store_files(done.store_commit, f"changed/{row.label}")["results.json"]


@pytest.mark.parametrize("fault", ["store_upload_refused", "store_wrong_bytes",
                                   "store_ghost_commit"])
def test_a_store_that_fails_keeps_the_box(fleet: OneShot, fault: str) -> None:
    row = _kept_run(fleet, fault.replace("_", "-"))
    fleet.fleet("sandbox", "fault", fault, "*")
    r = fleet.fleet("teardown", row.label, check=False)
    assert r.returncode != 0 and "kept" in r.stderr, r.stderr
    after = fleet.rows()[row.label]
    assert after.live and after.teardown and fleet.listed(after)
    if fault == "store_wrong_bytes":
        assert "sha256" in r.stderr
    if fault == "store_ghost_commit":  # success reported, nothing stored: caught
        assert after.store_commit is None
    with fleet.control() as c:
        c.clear_faults()
    fleet.fleet("teardown", row.label)
    assert fleet.rows()[row.label].status == "destroyed"


def test_a_busy_store_is_asked_again_and_the_box_destroyed(fleet: OneShot) -> None:
    row = _kept_run(fleet, "store-busy")
    fleet.fleet("sandbox", "fault", "store_busy", "*", "--count", "2")  # two read-back GETs
    fleet.fleet("teardown", row.label)
    done = fleet.rows()[row.label]
    assert done.status == "destroyed" and done.store_commit and not fleet.listed(done)
    armed = httpx.get(f"{fleet.env['HF_ENDPOINT']}/_sandbox/faults", timeout=10,
                      headers={"Authorization": f"Bearer {fleet.env['HF_TOKEN']}"})
    assert armed.json()["faults"] == []  # both 429s were met and waited out


def test_a_failed_provider_destroy_leaves_the_row_live_and_is_retried(fleet: OneShot) -> None:
    row = _kept_run(fleet, "destroy-fails")
    with fleet.control() as c:
        c.fault("server_error", "vast.destroy", count=5)  # every try of one call
    r = fleet.fleet("teardown", row.label, check=False)
    assert r.returncode != 0, r.stdout
    after = fleet.rows()[row.label]
    assert after.live and after.store_commit and "destroy failed" in (after.teardown or "")
    with fleet.control() as c:
        c.clear_faults()
    fleet.fleet("teardown", row.label)
    done = fleet.rows()[row.label]
    assert done.status == "destroyed" and done.store_commit == after.store_commit
    assert not fleet.listed(done)


def test_a_box_past_its_ttl_is_flagged_and_torn_down_by_expired(fleet: OneShot) -> None:
    row = _kept_run(fleet, "late")
    check = fleet.fleet("check", "--json", check=False)
    flagged = {h["label"]: h for h in json.loads(check.stdout)}[row.label]
    assert any("still billing" in p for p in flagged["problems"]), flagged  # job ended
    fleet.registry.update(row.label, expires_at="2000-01-01T00:00:00Z")  # time passes
    check = fleet.fleet("check", check=False)
    assert check.returncode == 1 and "past its TTL" in check.stdout, check.stdout
    fleet.fleet("teardown", "--expired")
    assert fleet.rows()[row.label].status == "destroyed"
    assert fleet.fleet("check", check=False).returncode == 0


@pytest.mark.parametrize(("changes", "says"), [
    ({"colour": '"blue"'}, "unknown key 'colour'"),
    ({"command": None}, "missing key 'command'"),
    ({"_branch": True}, "is not a commit"),
])
def test_a_bad_job_file_rents_nothing(fleet: OneShot, changes: dict[str, Any],
                                      says: str) -> None:
    job = fleet.job("bad", **{k: v for k, v in changes.items() if k != "_branch"})
    if "_branch" in changes:
        job.write_text(job.read_text().replace(fleet.revision, "main"))
    before = len(fleet.rows())
    r = fleet.fleet("run", "bench", str(job), check=False)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert len(fleet.rows()) == before


def test_a_second_job_on_the_same_box_fetches_nothing(fleet: OneShot) -> None:
    rented = json.loads(fleet.fleet("rent", "bench", "--provider", "vast", "--json").stdout)
    label = rented["label"]
    for name in ("warm-1", "warm-2"):
        fleet.run(str(BIN / "pyinfra"), "-y", "--limit", label, "inventory.py",
                  "deploys/oneshot.py", "--data", f"job={fleet.job(name)}")
    row = fleet.rows()[label]
    states = [json.loads(fleet.ssh(row, f"cat /root/fleet/jobs/{n}/state.json"))
              for n in ("warm-1", "warm-2")]
    assert states[0]["toolchain"]["bytes_fetched"] > 0 and not states[0]["toolchain"]["warm"]
    assert states[1]["toolchain"]["bytes_fetched"] == 0 and states[1]["toolchain"]["warm"]
    wait_for("the token file is private", lambda: fleet.ssh(
        row, "stat -c %a /root/fleet/hf_token").strip() == "600")
    fleet.fleet("destroy", label)
