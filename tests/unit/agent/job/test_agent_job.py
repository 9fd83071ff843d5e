"""One-shot jobs on the box: `python -m agent job admit|fetch|scan|gate|run|state`, run for real
against the stand-in NVML. The order is enforced on the box, every refusal records zero
invocations and says so in the outputs, and the command runs once, detached, at most."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentbox import DRIVER, PY, UUIDS, Box, free_port, gone, gpu_spec, wait_for
from jobtools import (
    HUB_TOKEN,
    JOB_PY,
    TOOLCHAIN_REPO,
    gcc,
    job,
    outcome,
    pytest_gate,
    runs,
    seed_toolchain,
    state_of,
    step_ok,
    workdir,
    write_job,
    write_token,
)
from repo_root import ROOT as REPO

from sandbox.hub import HubServer


def through_gates(box: Box, jobdir: Path) -> None:
    for step in ("admit", "fetch", "scan", "gate"):
        step_ok(box, step, jobdir)


def assert_refused(done: subprocess.CompletedProcess[str], step: str, reason: str) -> dict:
    assert done.returncode == 3, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"refused: {step}: ") and reason in lines[0]
    state = state_of(done)
    assert state["phase"] == "refused" and state["invocations"] == 0
    assert state["refused"]["step"] == step and reason in state["refused"]["reason"]
    return state


# ---------------------------------------------------------------- admission


def test_an_admitted_job_runs_once_through_every_step(box: Box) -> None:
    jobdir = write_job(box, admission={"qualified_gpus": UUIDS})
    state = step_ok(box, "admit", jobdir)
    assert state["phase"] == "admitted" and state["invocations"] == 0
    assert state["admission"]["admitted"] is True
    assert state["admission"]["driver"] == DRIVER and state["admission"]["uuids"] == UUIDS
    assert step_ok(box, "fetch", jobdir)["toolchain"] is None  # the job names none
    scan = step_ok(box, "scan", jobdir)["scan"]
    assert scan["modules"] == [{"path": "kernels/clean.ptx", "kind": "ptx", "names": 1}]
    assert scan["hits"] == [] and list(scan["digests"]) == ["kernels/clean.ptx"]
    assert step_ok(box, "gate", jobdir)["gates"] == []
    done = job(box, "run", jobdir, "--wait")
    assert done.returncode == 0, done.stderr
    state = state_of(done)
    assert state["phase"] == "finished" and state["invocations"] == 1
    assert state["exit_code"] == 0 and state["finished_at"] >= state["started_at"] > 0
    assert (workdir(jobdir) / "out" / "result.txt").read_text() == "42\n"
    assert runs(jobdir) == 1
    written = outcome(jobdir)
    assert written["job"] == "bench" and written["invocations"] == 1
    assert written["exit_code"] == 0 and written["refused"] is None
    assert written["admission"]["admitted"] is True and written["gates"] == []
    # every step again: done already, printed, nothing happens
    for step in ("admit", "fetch", "scan", "gate", "run"):
        again = step_ok(box, step, jobdir)
        assert again["phase"] == "finished" and again["invocations"] == 1
    assert job(box, "run", jobdir, "--wait").returncode == 0
    assert step_ok(box, "state", jobdir) == again
    assert runs(jobdir) == 1


@pytest.mark.parametrize("driver,qualified,reason", [
    ("580.105.08", [], f"driver 580.105.08 is not the admitted {DRIVER}"),
    ("595.71.05", [], f"driver 595.71.05 is not the admitted {DRIVER}"),
    (DRIVER, [UUIDS[0]], f"GPU {UUIDS[1]} is not among the qualified GPUs"),
])
def test_a_refused_box_records_zero_invocations_and_no_later_step_does_anything(
        box: Box, driver: str, qualified: list[str], reason: str) -> None:
    box.set_gpu(gpu_spec(driver=driver))
    jobdir = write_job(box, admission={"qualified_gpus": qualified},
                       gates=[pytest_gate("g", 1, "echo gate >> gates-ran")])
    state = assert_refused(job(box, "admit", jobdir), "gpu", reason)
    assert state["admission"]["admitted"] is False and state["admission"]["driver"] == driver
    written = outcome(jobdir)
    assert written["invocations"] == 0 and written["exit_code"] is None
    assert written["refused"] == {"step": "gpu", "reason": state["refused"]["reason"]}
    box.set_gpu(gpu_spec())  # even a box that is right now: a refused job stays refused
    for step in ("admit", "fetch", "scan", "gate", "run"):
        again = assert_refused(job(box, step, jobdir), "gpu", reason)
        assert again == state
    assert_refused(job(box, "run", jobdir, "--wait"), "gpu", reason)
    assert step_ok(box, "state", jobdir) == state  # `state` prints it and exits 0
    assert runs(jobdir) == 0 and not (workdir(jobdir) / "gates-ran").exists()
    assert not (jobdir / "job.log").exists()


def test_a_driver_changed_after_admission_refuses_the_run(box: Box) -> None:
    jobdir = write_job(box)
    through_gates(box, jobdir)
    box.set_gpu(gpu_spec(driver="580.105.08"))
    assert_refused(job(box, "run", jobdir, "--wait"), "gpu", "driver 580.105.08 is not")
    assert runs(jobdir) == 0 and outcome(jobdir)["invocations"] == 0


# ---------------------------------------------------------------- order and the job file


@pytest.mark.parametrize("step,first", [("run", "job admit"), ("fetch", "job admit"),
                                        ("scan", "job admit"), ("gate", "job admit")])
def test_a_step_before_its_turn_is_a_usage_error_that_changes_nothing(
        box: Box, step: str, first: str) -> None:
    jobdir = write_job(box)
    done = job(box, step, jobdir)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1
    assert first in done.stderr or "gates have not passed" in done.stderr
    assert not (jobdir / "state.json").exists() and runs(jobdir) == 0


def test_each_step_needs_the_one_before(box: Box) -> None:
    jobdir = write_job(box)
    step_ok(box, "admit", jobdir)
    for step in ("scan", "gate", "run"):
        done = job(box, step, jobdir)
        assert done.returncode == 2 and "job fetch" in done.stderr or "gates" in done.stderr
    step_ok(box, "fetch", jobdir)
    assert job(box, "gate", jobdir).returncode == 2
    assert job(box, "run", jobdir).returncode == 2
    assert step_ok(box, "state", jobdir)["phase"] == "fetched" and runs(jobdir) == 0


@pytest.mark.parametrize("change,message", [
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"ttl_minutes": "30"}, "ttl_minutes must be a positive number"),
    ({"gates": {"name": "g"}}, "gates must be a list"),
    ({"gates": [{"name": "g", "command": "true"}]}, "missing key 'min_passed'"),
    ({"modules": ["/etc/*.so"]}, "must be a relative path"),
    ({"outputs": "../elsewhere"}, "must be a relative path"),
    ({"name": "other"}, "must be the job directory's name"),
    ({"admission": {"driver": ""}}, "driver must be a non-empty string"),
    ({"admission": {"vendor": "amd"}}, "vendor 'amd' is refused: one-shot jobs run on NVIDIA"),
    ({"toolchain": {"repo": "fleet/t", "revision": "main", "path": "t"}},
     "missing key 'repo_type'"),
    ({"store_endpoint": "ftp://x"}, "store_endpoint must be null or an http(s) URL"),
])
def test_a_bad_job_file_is_one_line_and_exit_2(box: Box, change: dict, message: str) -> None:
    jobdir = write_job(box)
    spec = json.loads((jobdir / "job.json").read_text())
    if "admission" in change:
        change = {"admission": {**spec["admission"], **change["admission"]}}
    (jobdir / "job.json").write_text(json.dumps({**spec, **change}))
    for step in ("admit", "state"):
        done = job(box, step, jobdir)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("error: ") and message in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert not (jobdir / "state.json").exists()


def test_a_missing_key_and_a_file_that_is_not_json_are_usage_errors(box: Box) -> None:
    jobdir = write_job(box)
    spec = json.loads((jobdir / "job.json").read_text())
    del spec["command"]
    (jobdir / "job.json").write_text(json.dumps(spec))
    done = job(box, "admit", jobdir)
    assert done.returncode == 2 and "missing key 'command'" in done.stderr
    (jobdir / "job.json").write_text("{not json")
    done = job(box, "admit", jobdir)
    assert done.returncode == 2 and "is not JSON" in done.stderr
    done = job(box, "admit", box.root / "jobs" / "absent")
    assert done.returncode == 2 and "not found" in done.stderr


# ---------------------------------------------------------------- gates

PYTEST_GATE = f"{JOB_PY} -m pytest -q -p no:cacheprovider tests"


def write_tests(jobdir: Path, passing: int, failing: int = 0) -> None:
    tests = workdir(jobdir) / "tests"
    tests.mkdir(parents=True, exist_ok=True)
    body = "".join(f"def test_ok_{i}():\n    assert True\n\n" for i in range(passing))
    body += "".join(f"def test_bad_{i}():\n    assert False\n\n" for i in range(failing))
    (tests / "test_parity.py").write_text(body)


def test_a_passing_gate_records_its_count(box: Box) -> None:
    jobdir = write_job(box, gates=[
        {"name": "parity", "command": PYTEST_GATE, "min_passed": 3},
        pytest_gate("plain", 2),
    ])
    write_tests(jobdir, passing=3)
    for step in ("admit", "fetch", "scan"):
        step_ok(box, step, jobdir)
    state = step_ok(box, "gate", jobdir)
    assert state["phase"] == "gated"
    parity, plain = state["gates"]
    assert parity["name"] == "parity" and parity["ok"] is True
    assert parity["exit_code"] == 0 and parity["passed"] == 3 and parity["seconds"] >= 0
    assert "3 passed" in (jobdir / parity["log"]).read_text()
    assert plain["ok"] is True and plain["passed"] == 2 and plain["summary"] == "2 passed in 0.01s"


@pytest.mark.parametrize("passing,failing,min_passed,why", [
    (2, 1, 1, "exited 1, 1 failed; summary '1 failed, 2 passed in "),
    (3, 0, 5, "3 passed (at least 5 wanted); summary '3 passed in "),
])
def test_a_failing_gate_refuses_the_job(box: Box, passing: int, failing: int, min_passed: int,
                                        why: str) -> None:
    jobdir = write_job(box, gates=[
        {"name": "parity", "command": PYTEST_GATE, "min_passed": min_passed},
        pytest_gate("after", 1, "echo x >> after-ran"),
    ])
    write_tests(jobdir, passing, failing)
    for step in ("admit", "fetch", "scan"):
        step_ok(box, step, jobdir)
    state = assert_refused(job(box, "gate", jobdir), "gates", f"gate 'parity' failed: {why}")
    (parity,) = state["gates"]  # the gate after it never ran
    assert parity["ok"] is False and parity["passed"] == passing
    assert not (workdir(jobdir) / "after-ran").exists()
    assert outcome(jobdir)["gates"] == state["gates"]
    assert_refused(job(box, "run", jobdir, "--wait"), "gates", "gate 'parity' failed")
    assert runs(jobdir) == 0


def test_a_gate_that_wants_a_count_and_prints_none_fails(box: Box) -> None:
    jobdir = write_job(box, gates=[{"name": "quiet", "command": "true", "min_passed": 1}])
    for step in ("admit", "fetch", "scan"):
        step_ok(box, step, jobdir)
    assert_refused(job(box, "gate", jobdir), "gates",
                   "its output does not end with pytest's summary line (no test count)")


# ---------------------------------------------------------------- run


def test_run_detaches_and_a_second_run_adopts_instead_of_running_again(box: Box) -> None:
    # the file it waits for is in its work directory: the job's user cannot see the test's own
    jobdir = write_job(box, command=(
        "echo ran >> runs.txt; while [ ! -e release ]; do sleep 0.05; done; "
        f"echo 42 > out/result.txt # {box.tmp}"))
    release = workdir(jobdir) / "release"
    through_gates(box, jobdir)
    # the caller's pipes are not held by what it started: this returns while the job runs
    state = step_ok(box, "run", jobdir)
    assert state["phase"] == "running" and state["invocations"] == 1
    assert state["exit_code"] is None and state["started_at"] > 0
    runner = state["runner"]["pid"]
    assert os.getsid(runner) == runner  # its own session: a dropped SSH session cannot reach it
    wait_for(lambda: runs(jobdir) == 1, "the command started")
    command = wait_for(lambda: step_ok(box, "state", jobdir)["process"], "the command recorded")
    assert os.getpgid(command["pid"]) == command["pgid"] == command["pid"]
    again = step_ok(box, "run", jobdir)  # adopts: prints the state, starts nothing
    assert again["phase"] == "running" and again["runner"] == state["runner"]
    release.touch()
    done = job(box, "run", jobdir, "--wait")
    assert done.returncode == 0, done.stderr
    final = state_of(done)
    assert final["phase"] == "finished" and final["exit_code"] == 0 and final["invocations"] == 1
    assert runs(jobdir) == 1 and outcome(jobdir)["exit_code"] == 0
    log = (jobdir / "job.log").read_text()
    assert log.count("--- ") == 2 and "exit 0" in log


def test_a_failing_command_is_recorded_and_wait_exits_1(box: Box) -> None:
    jobdir = write_job(box, command="echo ran >> runs.txt; echo oops; exit 7")
    through_gates(box, jobdir)
    done = job(box, "run", jobdir, "--wait")
    assert done.returncode == 1
    state = state_of(done)
    assert state["phase"] == "failed" and state["exit_code"] == 7 and state["invocations"] == 1
    assert outcome(jobdir)["exit_code"] == 7 and outcome(jobdir)["refused"] is None
    assert "oops" in (jobdir / "job.log").read_text()
    assert job(box, "run", jobdir).returncode == 0  # prints the state, runs nothing
    assert job(box, "run", jobdir, "--wait").returncode == 1
    assert runs(jobdir) == 1


def test_a_sigkilled_runner_reads_as_interrupted_and_is_never_run_again(box: Box) -> None:
    jobdir = write_job(box, command=f"echo ran >> runs.txt; sleep 60 # {box.tmp}")
    through_gates(box, jobdir)
    state = step_ok(box, "run", jobdir)
    command = wait_for(lambda: step_ok(box, "state", jobdir)["process"], "the command recorded")
    runner = state["runner"]["pid"]
    os.kill(runner, signal.SIGKILL)
    wait_for(lambda: gone(runner), "the runner gone")
    state = step_ok(box, "state", jobdir)
    assert state["phase"] == "interrupted" and state["exit_code"] is None
    assert state["invocations"] == 1 and f"pid {runner}" in state["interrupted"]["reason"]
    wait_for(lambda: gone(command["pid"]), "what was left of the command killed")
    written = outcome(jobdir)
    assert written["phase"] == "interrupted" and written["invocations"] == 1
    assert job(box, "run", jobdir).returncode == 0
    assert job(box, "run", jobdir, "--wait").returncode == 1
    assert step_ok(box, "state", jobdir)["phase"] == "interrupted" and runs(jobdir) == 1


def test_a_command_past_the_ttl_is_killed_and_recorded(box: Box) -> None:
    jobdir = write_job(box, ttl_minutes=0.01, command=f"echo ran >> runs.txt; sleep 60 # {box.tmp}")
    through_gates(box, jobdir)
    done = job(box, "run", jobdir, "--wait")
    assert done.returncode == 1
    state = state_of(done)
    assert state["phase"] == "failed" and state["timed_out"] is True
    assert state["exit_code"] == -signal.SIGTERM and outcome(jobdir)["timed_out"] is True


# ---------------------------------------------------------------- the daemon's imports

HEAVY = ("huggingface_hub", "elftools")


def test_only_the_job_steps_import_huggingface_hub_and_pyelftools() -> None:
    """The supervising daemon's memory is a benchmarked target: nothing it imports may pull
    these in. Only job/fetch and job/scan import them, and only the job modules import those."""
    allowed = {"job/fetch.py": "huggingface_hub", "job/scan.py": "elftools"}
    for path in sorted((REPO / "agent").rglob("*.py")):
        name_in_agent = path.relative_to(REPO / "agent").as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in HEAVY:
                    assert allowed.get(name_in_agent) == top, f"{name_in_agent} imports {name}"
                if name.startswith("agent.job") and not name_in_agent.startswith("job/"):
                    # the CLI, inside the `job` command only (never at the top of the module)
                    assert path.name == "cli.py" and node not in tree.body, \
                        f"{path.name} imports {name}"
    code = ("import sys, agent.cli, agent.daemon.supervisor, agent.base.detach, "
            "agent.daemon.status; "
            "agent.cli._parser(); print(sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{HEAVY!r} or m.startswith('agent.job')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- the toolchain


@pytest.fixture
def hub(box: Box) -> Iterator[HubServer]:
    server = HubServer(box.tmp / "hub", HUB_TOKEN, poll_interval=0.01)
    try:
        yield server
    finally:
        server.close()


def toolchain_job(box: Box, name: str, revision: str, endpoint: str,
                  **overrides: object) -> Path:
    jobdir = write_job(box, name, store_endpoint=endpoint, toolchain={
        "repo": TOOLCHAIN_REPO, "revision": revision, "path": "toolchain",
        "repo_type": "dataset"}, **overrides)
    step_ok(box, "admit", jobdir)
    return jobdir


def no_secret_anywhere(box: Box, done: subprocess.CompletedProcess[str], *secrets: str) -> None:
    """Not in the command's output, nor in any file under the root but the token file."""
    for secret in secrets:
        assert secret not in done.stdout and secret not in done.stderr
        for path in box.root.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.name != "hf_token":
                assert secret.encode() not in path.read_bytes(), path


def test_a_toolchain_is_fetched_once_per_box_and_a_second_job_fetches_nothing(
        box: Box, hub: HubServer) -> None:
    kernel = gcc(box.tmp, "void add_k(void) {}\n", box.tmp / "k.o", "-c").read_bytes()
    files = {"kernels/add.cubin": kernel, "bin/tool": os.urandom(300_000), "README.md": b"hi\n"}
    commit = seed_toolchain(hub.store, files)
    write_token(box, HUB_TOKEN)
    jobdir = toolchain_job(box, "first", commit, hub.url,
                           modules=["toolchain/kernels/*.cubin"])
    done = job(box, "fetch", jobdir)
    assert done.returncode == 0, done.stderr
    tc = state_of(done)["toolchain"]
    assert tc["warm"] is False and tc["revision"] == commit and tc["files"] == 4  # .gitattributes
    assert tc["bytes_fetched"] == tc["bytes_total"] > sum(len(b) for b in files.values())
    assert tc["seconds"] >= 0 and tc["endpoint"] == hub.url
    for path, data in files.items():
        assert (workdir(jobdir) / "toolchain" / path).read_bytes() == data
    assert step_ok(box, "scan", jobdir)["scan"]["modules"][0]["kind"] == "cubin"
    no_secret_anywhere(box, done, HUB_TOKEN)
    # the same repo@commit for another job on this box: from the cache, without the store
    hub.close()
    second = toolchain_job(box, "second", commit, hub.url)
    warm = state_of(job(box, "fetch", second))["toolchain"]
    assert warm["warm"] is True and warm["bytes_fetched"] == 0 and warm["files"] == 4
    assert (workdir(second) / "toolchain" / "bin" / "tool").read_bytes() == files["bin/tool"]


def test_a_changed_file_in_the_cache_is_fetched_again(box: Box, hub: HubServer) -> None:
    files = {"bin/tool": os.urandom(50_000), "lib/a.txt": b"a\n"}
    commit = seed_toolchain(hub.store, files)
    write_token(box, HUB_TOKEN)
    first = toolchain_job(box, "first", commit, hub.url)
    step_ok(box, "fetch", first)
    blob = (workdir(first) / "toolchain" / "bin" / "tool").resolve()
    blob.write_bytes(b"tampered")
    assert not (box.root / "hf_token").exists()  # the first fetch consumed it
    write_token(box, HUB_TOKEN)  # as the deploy does for a job whose fetch is not done
    second = toolchain_job(box, "second", commit, hub.url)
    tc = step_ok(box, "fetch", second)["toolchain"]
    assert tc["warm"] is False and tc["bytes_fetched"] == len(files["bin/tool"])
    assert (workdir(second) / "toolchain" / "bin" / "tool").read_bytes() == files["bin/tool"]


def test_a_branch_name_is_refused(box: Box, hub: HubServer) -> None:
    seed_toolchain(hub.store, {"a.txt": b"a"})
    write_token(box, HUB_TOKEN)
    jobdir = toolchain_job(box, "bench", "main", hub.url)
    assert_refused(job(box, "fetch", jobdir), "toolchain", "a branch name is refused")
    assert outcome(jobdir)["refused"]["step"] == "toolchain"
    assert job(box, "scan", jobdir).returncode == 3 and runs(jobdir) == 0
    assert not (box.root / "cache" / "hub").exists()  # nothing was asked of the store


@pytest.mark.parametrize("case", ["wrong token", "no token", "unknown commit", "unreachable"])
def test_a_toolchain_that_cannot_be_had_is_a_refusal_naming_no_token(
        box: Box, hub: HubServer, case: str) -> None:
    commit = seed_toolchain(hub.store, {"a.txt": b"a"})
    wrong = "hf_wrong_token_0000000000000000"
    endpoint, reason = hub.url, "the store refused the token (401)"
    if case == "wrong token":
        write_token(box, wrong)
    elif case == "no token":
        pass
    else:
        write_token(box, HUB_TOKEN)
    if case == "unknown commit":
        commit, reason = "0123456789" * 4, "the revision is not in the repository"
    if case == "unreachable":
        endpoint, reason = f"http://127.0.0.1:{free_port()}", "the store is unreachable"
    jobdir = toolchain_job(box, "bench", commit, endpoint)
    done = job(box, "fetch", jobdir)
    state = assert_refused(done, "toolchain", reason)
    assert state["refused"]["reason"].startswith(
        f"cannot fetch the toolchain {TOOLCHAIN_REPO}@{commit[:12]} from {endpoint}: ")
    assert "Traceback" not in done.stderr
    assert outcome(jobdir)["invocations"] == 0
    assert job(box, "run", jobdir).returncode == 3 and runs(jobdir) == 0
    no_secret_anywhere(box, done, HUB_TOKEN, wrong)


def test_the_fetch_needs_none_of_the_packages_the_bundle_leaves_out(
        box: Box, hub: HubServer) -> None:
    """fleet/bundle.py ships huggingface_hub without hf_xet, click, fsspec, packaging and anyio:
    the fetch (cold, through every import it makes) works with those made unimportable."""
    commit = seed_toolchain(hub.store, {"bin/tool": os.urandom(20_000)})
    write_token(box, HUB_TOKEN)
    jobdir = toolchain_job(box, "bench", commit, hub.url)
    left_out = ["hf_xet", "click", "fsspec", "packaging", "anyio"]
    code = (f"import sys; sys.modules.update(dict.fromkeys({left_out!r})); "
            "from agent.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([PY, "-c", code, "job", "fetch", str(jobdir)], env=box.env(),
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert state_of(done)["toolchain"]["bytes_fetched"] >= 20_000


def test_the_jobs_code_cannot_swap_or_change_the_toolchain_the_scan_verified(
        box: Box, hub: HubServer) -> None:
    files = {"bin/tool": b"the real tool\n"}
    commit = seed_toolchain(hub.store, files)
    write_token(box, HUB_TOKEN)
    tamper = ("(echo evil >> toolchain/bin/tool) 2>/dev/null && echo wrote >> out/did; "
              "(rm -f toolchain) 2>/dev/null && echo removed >> out/did; "
              "(mv toolchain gone) 2>/dev/null && echo moved >> out/did; touch out/did")
    jobdir = toolchain_job(box, "tamper", commit, hub.url, command=tamper)
    for step in ("fetch", "scan", "gate"):
        step_ok(box, step, jobdir)
    link = workdir(jobdir) / "toolchain"
    target = os.readlink(link)
    assert state_of(job(box, "run", jobdir, "--wait"))["phase"] == "finished"
    assert (workdir(jobdir) / "out" / "did").read_text() == ""
    assert os.readlink(link) == target
    assert (link / "bin" / "tool").read_bytes() == files["bin/tool"]
