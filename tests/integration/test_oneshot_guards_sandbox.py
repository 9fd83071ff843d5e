"""The one-shot guards on sandbox boxes: no output is ever lost, no meter runs on, and a gate
that ran nothing never admits a job. Real boxes, the real deploy and agent, the real store;
each test rents its own box and ends with it destroyed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fleet_cli import BIN, REPO, wait_for
from oneshot_box import OneShot, archive_copy, oneshot_sandbox, stored_outputs

from agent.contract import JOB_UID, ROOT, job_workdir
from fleet.core.boxes import Row
from fleet.core.times import iso


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneShot]:
    yield from oneshot_sandbox(tmp_path_factory)


@pytest.fixture(autouse=True)
def no_faults(fleet: OneShot) -> None:
    with fleet.control() as c:
        c.clear_faults()


def _rent(fleet: OneShot) -> str:
    rented = json.loads(fleet.fleet("rent", "bench", "--provider", "vast", "--json").stdout)
    return str(rented["label"])


def _deploy_in_background(fleet: OneShot, label: str, job: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN / "pyinfra"), "-y", "--limit", label, "inventory.py", "deploys/oneshot.py",
         "--data", f"job={job}"], cwd=REPO, env=fleet.env, text=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _state(fleet: OneShot, row: Row, job: str) -> dict[str, Any]:
    out = fleet.ssh(row, f"cd /root/fleet && venv/bin/python -m agent job state jobs/{job}")
    return dict(json.loads(out))


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def test_a_running_job_is_read_only_after_the_boxs_deadline_and_its_stop(
        fleet: OneShot) -> None:
    label = _rent(fleet)
    command = "'mkdir -p out && printf \"first half\" > out/part.txt && sleep 3600'"
    deploy = _deploy_in_background(fleet, label, fleet.job("long", command=command,
                                                            ttl_minutes="60"))
    try:
        row = fleet.rows()[label]
        wait_for("the job running", lambda: _state(fleet, row, "long")["phase"] == "running",
                 timeout=180)
        # the registry's deadline (from the rent) has passed, within the cap that allows for the
        # install and the fetch; the box's (from the run) has not
        fleet.registry.update(label, expires_at=(datetime.now(UTC) - timedelta(minutes=10))
                              .isoformat().replace("+00:00", "Z"))
        fleet.fleet("teardown", "--expired", check=False)
        row = fleet.rows()[label]
        assert row.live and fleet.listed(row) and row.read_back is None
        assert _state(fleet, row, "long")["phase"] == "running"  # never stopped, never read
        assert not (fleet.tmp / "state" / "archive" / label / "long").exists()
        # time passes on the box: its run started two hours ago
        fleet.ssh(row, "cd /root/fleet/jobs/long && python3 -c \"import json, time; "
                  "s = json.load(open('state.json')); s['started_at'] = time.time() - 7200; "
                  "json.dump(s, open('state.json.new', 'w'))\" && mv state.json.new state.json")
        flagged = json.loads(fleet.fleet("check", "--json", check=False).stdout)
        assert any("past its deadline" in p for h in flagged if h["label"] == label
                   for p in h["problems"]), flagged
        fleet.fleet("teardown", "--expired")
        done = fleet.rows()[label]
        assert done.status == "destroyed" and done.read_back == "long"
        assert done.job_state in ("failed", "interrupted") and done.invocations == 1
        copy = archive_copy(fleet, label, "long")
        assert copy == {"part.txt": b"first half"}
    finally:
        _stop(deploy)


def test_two_teardowns_of_one_box_at_once_leave_one_verified_copy(fleet: OneShot) -> None:
    rc, s = fleet.run_job("bench", fleet.job("twice"), "--keep")
    assert rc == 0, s
    label = s["label"]
    procs = [subprocess.Popen([str(BIN / "fleet"), "teardown", label], cwd=fleet.tmp,
                              env=fleet.env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes[0] == 0 and codes[1] != 0, results
    loser = next(err for code, err in results if code != 0)
    assert "a teardown of this box is under way" in loser or "already destroyed" in \
        loser, loser
    assert "Traceback" not in loser
    row = fleet.rows()[label]
    assert row.status == "destroyed" and row.store_commit and not fleet.listed(row)
    stored, _ = stored_outputs(fleet, row.store_commit, f"twice/{label}")
    assert stored == archive_copy(fleet, label, "twice")
    assert [p.name for p in (fleet.tmp / "state" / "archive" / label).iterdir()] == ["twice"]


def test_outputs_named_like_the_fleets_files_or_the_hubs_reserved_folders(
        fleet: OneShot) -> None:
    command = ("'python3 run.py && echo mine > out/fleet-manifest.json && mkdir -p out/.git "
               "&& echo ref > out/.git/HEAD'")
    rc, s = fleet.run_job("bench", fleet.job("names", command=command))
    assert rc == 1 and s["kept"] and not s["destroyed"], s
    assert ".git/HEAD" in s["kept"] and "reserves" in s["kept"], s
    row = fleet.rows()[s["label"]]
    assert row.live and fleet.listed(row) and row.teardown and row.read_back is None
    fleet.ssh(row, f"rm -rf {job_workdir(ROOT, 'names')}/out/.git")  # the operator's fix
    fleet.fleet("teardown", row.label)
    done = fleet.rows()[row.label]
    assert done.status == "destroyed" and done.store_commit
    copy = archive_copy(fleet, row.label, "names")
    assert copy["fleet-manifest.json"] == b"mine\n"  # an output, not the fleet's manifest
    stored, manifest = stored_outputs(fleet, done.store_commit, f"names/{row.label}")
    assert stored == copy and "fleet-manifest.json" in {e["path"] for e in manifest}


def test_an_unreadable_job_state_is_not_well_and_keeps_the_box(fleet: OneShot) -> None:
    rc, s = fleet.run_job("bench", fleet.job("garbled"), "--keep")
    assert rc == 0, s
    row = fleet.rows()[s["label"]]
    fleet.ssh(row, "echo '{not json' > /root/fleet/jobs/garbled/state.json")
    check = fleet.fleet("check", "--json", check=False)
    assert check.returncode == 1
    flagged = {h["label"]: h for h in json.loads(check.stdout)}[row.label]
    assert any(p.startswith("job state unknown") for p in flagged["problems"]), flagged
    r = fleet.fleet("teardown", row.label, check=False)
    assert r.returncode == 1 and "box kept" in r.stderr, r.stderr
    assert fleet.rows()[row.label].live and fleet.listed(row)
    fleet.fleet("destroy", row.label, "--force")


def test_a_box_rented_without_a_job_is_flagged_after_the_grace_and_torn_down(
        fleet: OneShot) -> None:
    label = _rent(fleet)
    check = json.loads(fleet.fleet("check", "--json", check=False).stdout)
    assert {h["label"]: h for h in check}[label]["well"]  # young: a job may still come
    fleet.registry.update(label, created_at=iso(datetime.now(UTC) - timedelta(hours=1)))
    check = json.loads(fleet.fleet("check", "--json", check=False).stdout)
    flagged = {h["label"]: h for h in check}[label]
    assert any(p.startswith("no job after 60 min") for p in flagged["problems"]), flagged
    fleet.fleet("teardown", "--expired")
    row = fleet.rows()[label]
    assert row.status == "destroyed" and not fleet.listed(row)


def test_a_change_after_a_failed_destroy_is_pushed_anew(fleet: OneShot) -> None:
    rc, s = fleet.run_job("bench", fleet.job("redo"), "--keep")
    assert rc == 0, s
    label = s["label"]
    r = fleet.fleet("destroy", label, check=False)  # not read back: the outputs would be lost
    assert r.returncode == 2 and "not read back" in r.stderr and "fleet teardown" in r.stderr
    with fleet.control() as c:
        c.fault("server_error", "vast.destroy", count=5)
    assert fleet.fleet("teardown", label, check=False).returncode != 0
    first = fleet.rows()[label]
    assert first.live and first.store_commit and "destroy failed" in (first.teardown or "")
    fleet.ssh(first, f"echo again >> {job_workdir(ROOT, 'redo')}/out/results.json")
    with fleet.control() as c:
        c.clear_faults()
    fleet.fleet("teardown", label)
    done = fleet.rows()[label]
    assert done.status == "destroyed" and done.store_commit != first.store_commit
    assert done.store_commit is not None
    stored, _ = stored_outputs(fleet, done.store_commit, f"redo/{label}")
    assert stored["results.json"].endswith(b"again\n")
    assert stored == archive_copy(fleet, label, "redo")


def test_the_job_runs_without_the_store_token(fleet: OneShot) -> None:
    command = ("'python3 run.py && (test -e /root/fleet/hf_token && echo present || "
               "echo absent) > out/token.txt'")
    rc, s = fleet.run_job("bench", fleet.job("tokenless", command=command))
    assert rc == 0 and s["destroyed"] and s["toolchain"]["bytes_fetched"] > 0, s
    assert archive_copy(fleet, s["label"], "tokenless")["token.txt"] == b"absent\n"


def test_a_gate_that_ran_no_test_refuses_the_job(fleet: OneShot) -> None:
    gates = ('[[gates]]\nname = "parity"\n'
             'command = "python3 -c \\"print(\'12 skipped in 0.51s\')\\""\nmin_passed = 1\n')
    rc, s = fleet.run_job("bench", fleet.job("skipped", _gates=gates))
    assert rc == 3, s
    assert s["invocations"] == 0 and s["refusal"].startswith("gates:") and s["destroyed"], s


def test_a_link_in_the_outputs_keeps_the_box_and_is_named(fleet: OneShot) -> None:
    command = "'python3 run.py && ln -s results.json out/latest'"
    rc, s = fleet.run_job("bench", fleet.job("linked", command=command))
    assert rc == 1 and s["kept"] and not s["destroyed"], s
    assert "latest: a link to results.json" in s["kept"], s
    row = fleet.rows()[s["label"]]
    assert row.live and fleet.listed(row) and row.read_back is None
    fleet.ssh(row, f"cd {job_workdir(ROOT, 'linked')}/out && rm latest && cp results.json "
              "latest")  # the operator's fix: the file in the link's place
    fleet.fleet("teardown", row.label)
    assert fleet.rows()[row.label].status == "destroyed"
    copy = archive_copy(fleet, row.label, "linked")
    assert copy["latest"] == copy["results.json"]


def test_a_job_stopped_between_steps_is_closed_and_the_box_destroyed(fleet: OneShot) -> None:
    label = _rent(fleet)
    gates = '[[gates]]\nname = "slow"\ncommand = "sleep 600"\nmin_passed = 1\n'
    deploy = _deploy_in_background(fleet, label, fleet.job("halted", _gates=gates))
    try:
        row = fleet.rows()[label]
        gating = wait_for("the gate running", lambda: _state(fleet, row, "halted").get("gating"),
                          timeout=180)
    finally:
        _stop(deploy)  # the operator's deploy dies in the middle of the gate step
    # and its gate step with it (a box that restarted would do the same): nothing is left to
    # record an end, and the job stays between two steps
    fleet.ssh(row, f"pkill -9 -f 'agent job [g]ate' ; kill -9 -- -{int(gating['pgid'])} || true")
    state = wait_for("the gate gone", lambda: (lambda s: s if not s.get("gating") else None)(
        _state(fleet, row, "halted")))
    # between steps, the box's own deadline counts from the dead gate step's start
    started = state["steps"]["gate"]["started_at"]
    assert state["phase"] == "scanned" and state["steps"]["gate"]["ended_at"] is None, state
    assert state["deadline_at"] == datetime.fromtimestamp(int(started + 30 * 60), UTC) \
        .isoformat().replace("+00:00", "Z"), state
    # the outputs folder, made (the job user's) at the gate step's start, holds nothing
    assert fleet.ssh(row, f"ls -A {job_workdir(ROOT, 'halted')}/out").strip() == ""
    fleet.fleet("teardown", label)
    done = fleet.rows()[label]
    assert done.status == "destroyed" and done.read_back == "halted", done
    assert done.job_state == "interrupted" and done.invocations == 0
    # nothing of the job's own, and nothing of the agent's: its outputs are empty
    assert archive_copy(fleet, label, "halted") == {}


def test_a_job_naming_no_modules_for_a_role_that_bans_symbols_rents_nothing(
        fleet: OneShot) -> None:
    before = len(fleet.rows())
    r = fleet.fleet("run", "bench", str(fleet.job("unscanned", modules="[]")), check=False)
    assert r.returncode == 2 and "must name its compiled modules" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert len(fleet.rows()) == before


def test_a_gates_daemon_in_its_own_session_is_gone_from_a_kept_box(fleet: OneShot) -> None:
    daemon = "sleep 6017"  # a command line no other test's box runs
    # its environment cleared and in a session of its own: only its uid tells it is the job's
    gates = ('[[gates]]\nname = "parity"\ncommand = "env -i setsid -f ' + daemon + ' </dev/null '
             '>/dev/null 2>&1; python3 parity.py"\nmin_passed = 4\n')
    rc, s = fleet.run_job("bench", fleet.job("daemon", _gates=gates), "--keep")
    assert rc == 0 and s["verdict"] == "ran" and not s["destroyed"], s
    row = fleet.rows()[s["label"]]
    assert fleet.ssh(row, f"pgrep -f '^{daemon}$' || true").strip() == ""
    assert fleet.ssh(row, f"pgrep -U {JOB_UID} || true").strip() == ""  # nothing of the job's
    assert s["gates"][0]["ok"] and s["gates"][0]["killed"] == 1, s["gates"]
    fleet.fleet("teardown", row.label)
    assert fleet.rows()[row.label].status == "destroyed"


def test_a_refused_job_leaves_no_process_of_its_own_on_the_box(fleet: OneShot) -> None:
    label = _rent(fleet)
    daemon = "sleep 6018"
    gates = ('[[gates]]\nname = "parity"\ncommand = "setsid -f ' + daemon + ' </dev/null '
             ">/dev/null 2>&1; echo '1 failed, 4 passed in 0.1s'\"\nmin_passed = 4\n")
    deploy = _deploy_in_background(fleet, label, fleet.job("refusedd", _gates=gates))
    try:
        assert deploy.wait(timeout=300) != 0  # the deploy fails for the refused box
    finally:
        _stop(deploy)
    row = fleet.rows()[label]
    state = _state(fleet, row, "refusedd")
    assert state["phase"] == "refused" and state["invocations"] == 0, state
    assert fleet.ssh(row, f"pgrep -f '^{daemon}$' || true").strip() == ""
    assert "1 failed" in state["refused"]["reason"] and state["gates"][0]["killed"] == 1
    fleet.fleet("teardown", label)
    assert fleet.rows()[label].status == "destroyed"
