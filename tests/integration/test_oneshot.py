"""One-shot boxes end to end in the sandbox: real boxes (SSH hosts), the real deploy and agent,
the sandbox's Hub-compatible store through the real huggingface_hub, the real providers' fakes.

Each test rents its own box through `fleet run` (or the pyinfra deploy by hand) and ends with
it destroyed or deliberately kept; no test depends on another's box.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fleet_cli import BIN
from oneshot_box import (
    OneShot,
    archive_copy,
    archived_manifest,
    manifest_of,
    oneshot_sandbox,
    stored_outputs,
)

from fleet.core.boxes import Row


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneShot]:
    yield from oneshot_sandbox(tmp_path_factory)


@pytest.fixture(autouse=True)
def no_faults(fleet: OneShot) -> None:
    with fleet.control() as c:
        c.clear_faults()


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
    archived = archive_copy(fleet, row.label, "happy")
    manifest = archived_manifest(fleet, row.label, "happy")
    assert {e["path"]: e["sha256"] for e in manifest} == manifest_of(archived)
    assert {"results.json", "samples.bin"} <= set(archived)
    assert "fleet-job.json" not in archived  # the agent's record stays out of the outputs
    stored, stored_manifest = stored_outputs(fleet, s["store_commit"], f"happy/{row.label}")
    assert stored_manifest == manifest and stored == archived


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
    # the job's own outputs never appeared: it did not run, and the agent writes none
    assert archive_copy(fleet, row.label, job) == {}
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
    assert archive_copy(fleet, label, "byhand")


def _kept_run(fleet: OneShot, name: str) -> Row:
    rc, s = fleet.run_job("bench", fleet.job(name), "--keep")
    assert rc == 0 and not s["destroyed"], s
    return fleet.rows()[s["label"]]


def test_an_output_written_after_it_was_read_keeps_the_box(fleet: OneShot,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from fleet.core.config import load
    from fleet.core.errors import FleetError
    from fleet.ops import teardown
    from fleet.providers.factory import all_providers

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
    stored, _ = stored_outputs(fleet, done.store_commit, f"changed/{row.label}")
    assert b"late" in stored["results.json"]


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
    assert check.returncode == 1 and "past its deadline" in check.stdout, check.stdout
    fleet.fleet("teardown", "--expired")
    assert fleet.rows()[row.label].status == "destroyed"
    assert fleet.fleet("check", check=False).returncode == 0


@pytest.mark.parametrize(("changes", "says"), [
    ({"colour": '"blue"'}, "unknown key 'colour'"),
    ({"command": None}, "missing key 'command'"),
    ({"_branch": True}, "is not a commit"),
    # the agent's own parser refuses these: before, the box was rented and the agent crashed
    ({"outputs": '"o\\u0000ut"'}, "outputs"),
    ({"outputs": '"toolchain"'}, "overlap"),
    ({"_gates": '[[gates]]\nname = "p"\ncommand = "set +e; python3 parity.py"\n'},
     "set -e"),
    ({"_gates": '[[gates]]\nname = "p"\ncommand = "python3 parity.py || true"\n'},
     "cannot be read strictly: '||'"),
    # inputs the agent would refuse at its steps, or break on at the run
    ({"_files": {"toolchain/kernels/own.ptx": "x"}}, "the toolchain would hide it"),
    ({"modules": '["toolchain/kernels/*.ptx", "kernels/*.cubin"]'},
     "module glob 'kernels/*.cubin' matched nothing"),
    ({"_files": {"out": "a file"}}, "workdir/out exists in the job's inputs and is not a folder"),
])
def test_a_bad_job_file_rents_nothing(fleet: OneShot, changes: dict[str, Any],
                                      says: str) -> None:
    job = fleet.job("bad", **{k: v for k, v in changes.items() if k not in ("_branch", "_files")})
    for rel, data in changes.get("_files", {}).items():
        (job.parent / "inputs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (job.parent / "inputs" / rel).write_text(data)
    if "_branch" in changes:
        job.write_text(job.read_text().replace(fleet.revision, "main"))
    before = len(fleet.rows())
    r = fleet.fleet("run", "bench", str(job), check=False)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert len(fleet.rows()) == before


def test_a_second_job_on_the_same_box_waits_for_the_first_read_back_and_fetches_nothing(
        fleet: OneShot) -> None:
    rented = json.loads(fleet.fleet("rent", "bench", "--provider", "vast", "--json").stdout)
    label = rented["label"]

    def deploy(name: str) -> subprocess.CompletedProcess[str]:
        return fleet.run(str(BIN / "pyinfra"), "-y", "--limit", label, "inventory.py",
                         "deploys/oneshot.py", "--data", f"job={fleet.job(name)}", check=False)

    assert deploy("warm-1").returncode == 0
    refused = deploy("warm-2")  # warm-1's outputs were never pulled: they would be lost
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "still holds job warm-1, not read back" in said, said
    row = fleet.rows()[label]
    assert row.job == "warm-1" and row.read_back is None
    assert "warm-2" not in fleet.ssh(row, "ls /root/fleet/jobs")
    fleet.fleet("teardown", label, "--keep-box")
    row = fleet.rows()[label]
    assert row.live and row.read_back == "warm-1" and fleet.listed(row)
    assert "results.json" in archive_copy(fleet, label, "warm-1")
    assert deploy("warm-2").returncode == 0
    row = fleet.rows()[label]
    assert row.job == "warm-2" and row.read_back is None and row.store_commit is None
    states = [json.loads(fleet.ssh(row, f"cat /root/fleet/jobs/{n}/state.json"))
              for n in ("warm-1", "warm-2")]
    assert states[0]["toolchain"]["bytes_fetched"] > 0 and not states[0]["toolchain"]["warm"]
    assert states[1]["toolchain"]["bytes_fetched"] == 0 and states[1]["toolchain"]["warm"]
    r = fleet.fleet("destroy", label, check=False)  # warm-2 is not read back either
    assert r.returncode == 2 and "not read back" in r.stderr, r.stderr
    fleet.fleet("teardown", label)
    assert fleet.rows()[label].status == "destroyed"
