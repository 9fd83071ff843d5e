"""The one-shot path's guards on the operator's side (no output lost, no meter left
running): a job still running is never read, two teardowns of one box never share anything,
a second job never hides the first's outputs, an unreadable box is not well, a jobless box is
flagged, a pull whose local side fails never hangs, a stale store commit is pushed anew, a box
that never came up is destroyed.

The box and the store are stand-ins here (their real counterparts are exercised on sandbox
boxes in tests/integration/test_oneshot.py); the teardown, the registry, the archive and the
locks are the real ones.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from state_fixture import dump

from fleet.boxes import boxssh, jobstate, lifecycle
from fleet.core import fileutil
from fleet.core.boxes import Row, unread
from fleet.core.config import Config, parse
from fleet.core.errors import FleetError, ProviderError, UsageError
from fleet.core.times import iso
from fleet.ops import oneshot, teardown, watchdog
from fleet.providers import store
from fleet.state import archive
from fleet.state.registry import Registry

CONFIG = {
    "fleet": {"registry": "state/boxes.json"},
    "store": {"repo": "fleet/outputs", "archive": "state/archive"},
    "roles": {"bench": {"kind": "oneshot", "image": "img", "disk_gb": 20,
                        "admitted_driver": "580.95.05"}},
}
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtest"
MANIFEST = [{"path": "r.json", "size": 2, "sha256": "0" * 64}]


class Vast:
    name = "vast"

    def __init__(self, ready: bool = False) -> None:
        self.destroyed: list[str] = []
        self.ready = ready

    def destroy(self, box_id: str) -> None:
        self.destroyed.append(box_id)

    def box(self, box_id: str) -> Any:
        return None if box_id in self.destroyed else self.listing(box_id)

    def listing(self, box_id: str) -> Any:
        from fleet.providers.base import Box

        up = self.ready
        return Box(provider="vast", box_id=box_id, label="bench-1", card="RTX 4090",
                   gpu_count=1, usd_per_hour=0.4, status="running" if up else "provisioning",
                   ssh_host="127.0.0.1" if up else None, ssh_port=2222 if up else None)


class Box:
    """The box's side of the teardown: its job's state, and each command it was sent."""

    def __init__(self, phase: str = "finished", started: datetime | None = None) -> None:
        self.state: dict[str, Any] = {"phase": phase, "invocations": 1}
        if started is not None:
            self.state["started_at"] = iso(started)
        self.sent: list[str] = []

    def run(self, cfg: Config, row: Row, command: str, timeout: float = 120.0
            ) -> subprocess.CompletedProcess[str]:
        self.sent.append(command)
        if " job stop " in command:
            self.state.update(phase="failed", stopped=True)
            return subprocess.CompletedProcess([], 0, json.dumps(self.state), "")
        raise AssertionError(f"unexpected command on the box: {command}")


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return parse(CONFIG, tmp_path / "fleet.toml")


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    r = Registry(tmp_path / "state" / "boxes.json")
    r.add(Row(label="bench-1", provider="vast", role="bench", kind="oneshot", card="RTX 4090",
              gpu_count=1, usd_per_hour=0.4, status="running", provider_id="42", job="j1",
              outputs="out", host_key=KEY, ssh_host="127.0.0.1", ssh_port=2222))
    return r


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Box:
    """A box whose job the teardown reads; the store and the pull stand in, in order."""
    b = Box()
    monkeypatch.setattr(boxssh, "run", b.run)
    monkeypatch.setattr(teardown, "_remote_job", lambda *a: {
        "spec": {"outputs": "out", "ttl_minutes": 30}, "state": dict(b.state)})

    def pull(*a: Any) -> archive.Pulled:
        b.sent.append("pull")
        return archive.Pulled(tmp_path / "state/archive/bench-1/j1/outputs", 1, 2, [], MANIFEST)

    monkeypatch.setattr(teardown, "_pull", pull)
    monkeypatch.setattr(store, "push", lambda *a: b.sent.append("push") or "c" * 40)
    monkeypatch.setattr(store, "read_back", lambda *a: b.sent.append("read back") or [])
    monkeypatch.setattr(teardown, "_unchanged", lambda *a: [])
    monkeypatch.setattr(archive, "make_durable", lambda path: None)
    return b


# --- 1. a running job is never read ----------------------------------------------------------

def test_a_running_job_within_the_boxs_deadline_is_refused_and_nothing_is_read(
        cfg: Config, reg: Registry, box: Box) -> None:
    # the registry's TTL (from the rent) has passed, the box's (from the run's start) has not,
    # within the cap (a run that started late, after a slow install and fetch)
    reg.update("bench-1", expires_at=iso(datetime.now(UTC) - timedelta(minutes=10)))
    box.state = {"phase": "running", "invocations": 1,
                 "started_at": (datetime.now(UTC) - timedelta(minutes=5)).timestamp()}
    vast = Vast()
    with pytest.raises(UsageError, match="still running"):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert box.sent == [] and vast.destroyed == []
    row = reg.get("bench-1")
    assert row is not None and row.live and row.read_back is None


def test_a_running_job_past_the_boxs_deadline_is_stopped_before_it_is_read(
        cfg: Config, reg: Registry, box: Box) -> None:
    box.state = {"phase": "running", "invocations": 1,
                 "started_at": (datetime.now(UTC) - timedelta(minutes=31)).timestamp()}
    vast = Vast()
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert "job stop" in box.sent[0] and "--grace" in box.sent[0]
    assert box.sent[1:] == ["pull", "push", "read back"]
    assert out.destroyed and out.phase == "failed" and vast.destroyed == ["42"]
    row = reg.get("bench-1")
    assert row is not None and row.read_back == "j1" and row.job_state == "failed"


def test_a_running_job_that_pushed_its_deadline_back_is_stopped_at_the_cap(
        cfg: Config, reg: Registry, box: Box) -> None:
    # the job rewrote its state.json: its run "started" now; the rent's deadline plus the
    # allowance for the install and the fetch has passed
    reg.update("bench-1", expires_at=iso(datetime.now(UTC) - timedelta(minutes=61)))
    box.state = {"phase": "running", "invocations": 1, "started_at": datetime.now(UTC).timestamp(),
                 "deadline_at": iso(datetime.now(UTC) + timedelta(days=3650))}
    vast = Vast()
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert "job stop" in box.sent[0]
    assert box.sent[1:] == ["pull", "push", "read back"]
    assert out.destroyed and vast.destroyed == ["42"]


def test_a_running_job_with_no_deadline_the_box_can_tell_is_stopped_at_the_cap(
        cfg: Config, reg: Registry, box: Box) -> None:
    # the job rewrote its state.json with neither a deadline nor a start: past the cap the
    # box's word no longer counts, and an unknown deadline must not stop the teardown
    reg.update("bench-1", expires_at=iso(datetime.now(UTC) - timedelta(minutes=61)))
    box.state = {"phase": "running", "invocations": 1}
    vast = Vast()
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert "job stop" in box.sent[0]
    assert box.sent[1:] == ["pull", "push", "read back"]
    assert out.destroyed and vast.destroyed == ["42"]


def test_a_gate_still_within_its_deadline_is_refused_like_a_run(
        cfg: Config, reg: Registry, box: Box) -> None:
    # each gate may take a full TTL: the box says when this one's ends
    box.state = {"phase": "scanned", "invocations": 0, "gating": {"gate": "parity"},
                 "deadline_at": iso(datetime.now(UTC) + timedelta(minutes=20))}
    with pytest.raises(UsageError, match="still in a gate"):
        teardown.teardown(cfg, reg, {"vast": Vast()}, "bench-1")  # type: ignore[dict-item]
    assert box.sent == []
    row = reg.get("bench-1")
    assert row is not None
    w = watchdog.judge(row, box.state, None, datetime.now(UTC))
    assert w.well and not w.due and round(w.ttl_left_min or 0) == 20


def test_a_job_stopped_before_its_run_is_closed_on_the_box_before_the_read(
        cfg: Config, reg: Registry, box: Box) -> None:
    box.state = {"phase": "gated", "invocations": 0}  # the run could still start after a read
    teardown.teardown(cfg, reg, {"vast": Vast()}, "bench-1")  # type: ignore[dict-item]
    assert "job stop" in box.sent[0] and box.sent[1] == "pull"


def test_a_job_the_box_cannot_stop_keeps_the_box(cfg: Config, reg: Registry, box: Box,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    box.state = {"phase": "running", "invocations": 1, "started_at": "2000-01-01T00:00:00Z"}
    monkeypatch.setattr(boxssh, "run", lambda *a, **k: subprocess.CompletedProcess(
        [], 255, "", "ssh: connect to host: Connection refused"))
    vast = Vast()
    with pytest.raises(teardown.KeptBox, match="could not be stopped"):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert vast.destroyed == [] and "pull" not in box.sent


# --- 2. one teardown of a box at a time, the row read again before each step ---------------------

def test_a_second_teardown_of_the_same_box_changes_nothing(cfg: Config, reg: Registry,
                                                            box: Box) -> None:
    before = dump(reg.path)
    vast = Vast()
    with fileutil.locked(reg.path.parent / "locks" / "teardown-bench-1.lock"):
        with pytest.raises(FleetError, match="a teardown of this box is under way"):
            teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert box.sent == [] and vast.destroyed == [] and dump(reg.path) == before


def test_a_box_destroyed_by_another_hand_mid_teardown_stops_it(
        cfg: Config, reg: Registry, box: Box, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def pull_then_gone(*a: Any) -> archive.Pulled:
        reg.mark_destroyed("bench-1")  # `fleet destroy --force` meanwhile
        return archive.Pulled(tmp_path / "a/outputs", 1, 2, [], MANIFEST)

    monkeypatch.setattr(teardown, "_pull", pull_then_gone)
    vast = Vast()
    with pytest.raises(UsageError, match="already destroyed"):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert "push" not in box.sent and vast.destroyed == []


# --- 3. a second job never hides the first's outputs ------------------------------------------

def test_a_new_job_on_a_box_whose_last_job_was_not_read_back_is_refused(
        cfg: Config, reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.boxes import deploy_support

    monkeypatch.setattr(deploy_support, "config", lambda: cfg)
    with pytest.raises(UsageError, match="still holds job j1, not read back"):
        oneshot.mark_job("bench-1", "j2", 30)
    row = reg.get("bench-1")
    assert row is not None and row.job == "j1"
    reg.update("bench-1", read_back="j1", store_commit="c" * 40, job_state="finished")
    oneshot.mark_job("bench-1", "j2", 30, gates=2)
    row = reg.get("bench-1")
    assert row is not None and row.job == "j2" and row.read_back is None
    assert row.store_commit is None and row.job_state is None  # nothing of j1 carries over
    left = datetime.fromisoformat(str(row.expires_at).replace("Z", "+00:00")) - datetime.now(UTC)
    assert timedelta(minutes=85) < left <= timedelta(minutes=90)  # each gate a TTL, then the run


def test_teardown_keep_box_reads_back_and_leaves_the_box_for_another_job(
        cfg: Config, reg: Registry, box: Box) -> None:
    vast = Vast()
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1",  # type: ignore[dict-item]
                            keep_box=True)
    assert not out.destroyed and vast.destroyed == [] and box.sent == ["pull", "push",
                                                                        "read back"]
    row = reg.get("bench-1")
    assert row is not None and row.live and row.read_back == "j1"


# --- 8, 9. the watchdog: unknown is not well, and a jobless box is flagged ---------------------

def test_a_box_that_cannot_be_read_is_not_well(cfg: Config, reg: Registry,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for rc, err in ((255, "ssh: connect to host 127.0.0.1 port 2222: Connection refused"),
                    (1, "agent: state.json: not JSON")):
        monkeypatch.setattr(boxssh, "run", lambda *a, rc=rc, err=err, **k:
                            subprocess.CompletedProcess([], rc, "", err))
        with pytest.raises(FleetError, match="cannot read job j1's state"):
            jobstate.job_state(cfg, reg.get("bench-1"), "j1")  # type: ignore[arg-type]
        (w,) = watchdog.watch(cfg, reg)
        assert not w.well and w.problems == [
            f"job state unknown: bench-1: cannot read job j1's state on the box ({err})"]


def test_a_job_not_staged_yet_reads_as_no_state(cfg: Config, reg: Registry,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boxssh, "run", lambda *a, **k: subprocess.CompletedProcess(
        [], jobstate.NOT_STAGED, "", ""))
    assert jobstate.job_state(cfg, reg.get("bench-1"), "j1") == {}  # type: ignore[arg-type]


def test_a_one_shot_box_without_a_job_is_flagged_after_the_grace(reg: Registry) -> None:
    now = datetime.now(UTC)
    young = Row(label="b", provider="vast", role="bench", kind="oneshot", card="x",
                gpu_count=1, usd_per_hour=0.4, status="running", created_at=iso(now))
    assert watchdog.judge(young, None, None, now).well
    old = watchdog.judge(young, None, None, now + timedelta(days=30))
    assert not old.well and old.due and "no job after 43200 min" in old.problems[0]


def test_a_running_job_is_judged_by_the_boxs_deadline(reg: Registry) -> None:
    now = datetime.now(UTC)
    row = reg.get("bench-1")
    assert row is not None
    row.expires_at = iso(now - timedelta(minutes=1))  # the rent's TTL: gates took long
    on_time = {"phase": "running", "deadline_at": iso(now + timedelta(minutes=20))}
    assert watchdog.judge(row, on_time, None, now).well
    late = {"phase": "running", "deadline_at": iso(now - timedelta(minutes=2))}
    w = watchdog.judge(row, late, None, now)
    assert w.due and w.problems == ["past its deadline by 2 min; the meter is running"]


# --- 10. a pull whose local side fails never hangs ---------------------------------------------

def test_a_pull_that_fails_locally_ends_the_ssh_stream(cfg: Config, reg: Registry,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # the box side: a stream that never ends by itself (ssh blocked on a full pipe)
    endless = [sys.executable, "-c",
               "import sys\nwhile True: sys.stdout.buffer.write(b'x' * 65536)"]
    procs: list[subprocess.Popen[bytes]] = []

    def stream(*a: Any) -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen(endless, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        return procs[-1]

    def full_disk(src: Any, *a: Any) -> archive.Pulled:
        src.read(1 << 16)
        raise FleetError("bench-1: pulling the outputs failed: [Errno 28] No space left")

    monkeypatch.setattr(boxssh, "stream", stream)
    monkeypatch.setattr(archive, "pull", full_disk)
    failed: list[BaseException] = []

    def pull() -> None:
        try:
            row = reg.get("bench-1")
            assert row is not None
            teardown._pull(cfg, row, "/root/fleet/jobs/j1/workdir/out", "j1")
        except FleetError as e:
            failed.append(e)

    t = threading.Thread(target=pull, daemon=True)
    t.start()
    t.join(timeout=120)
    try:
        assert not t.is_alive(), "the pull hung on the box's stream"
        assert failed and "No space left" in str(failed[0])
        assert procs[0].returncode is not None
    finally:
        for p in procs:
            p.kill()


# --- 12. a commit recorded before a failed destroy, stale since --------------------------------

def test_a_recorded_commit_that_no_longer_matches_the_box_is_pushed_anew(
        cfg: Config, reg: Registry, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    reg.update("bench-1", store_commit="a" * 40, teardown="destroy failed: HTTP 500")
    reads: list[str] = []

    def read_back(repo: str, commit: str, *a: Any) -> list[str]:
        reads.append(commit)
        return ["r.json: store at aaaa has 1 bytes, manifest says 2"] if commit == "a" * 40 \
            else []

    monkeypatch.setattr(store, "read_back", read_back)
    vast = Vast()
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert reads == ["a" * 40, "c" * 40] and "push" in box.sent
    assert out.destroyed and out.commit == "c" * 40
    row = reg.get("bench-1")
    assert row is not None and row.store_commit == "c" * 40 and row.status == "destroyed"


# --- 13. a box that never became SSH-ready -----------------------------------------------------

def test_a_box_never_ssh_ready_is_destroyed_without_a_read(cfg: Config, reg: Registry,
                                                           box: Box) -> None:
    reg.update("bench-1", host_key=None, ssh_host=None, ssh_port=None)
    vast = Vast(ready=False)
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert out.destroyed and vast.destroyed == ["42"] and box.sent == []
    assert out.steps == ["never SSH-ready: nothing to read back"]


def test_a_box_that_came_up_after_the_wait_is_pinned_and_read(
        cfg: Config, reg: Registry, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(lifecycle, "host_key_if_ready", lambda b: KEY if b.ssh_ready else None)
    reg.update("bench-1", host_key=None, ssh_host=None, ssh_port=None)
    vast = Vast(ready=True)
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    row = reg.get("bench-1")
    assert row is not None and row.host_key == KEY and KEY in cfg.known_hosts.read_text()
    assert box.sent == ["pull", "push", "read back"] and out.destroyed


def test_fleet_run_destroys_a_box_that_never_became_ready(
        cfg: Config, reg: Registry, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.core.job import Job
    from fleet.ops import offers
    from fleet.ops import rent as rent_mod

    reg.update("bench-1", host_key=None, ssh_host=None, ssh_port=None, job=None)
    vast = Vast(ready=False)
    monkeypatch.setattr(offers, "search", lambda *a, **k: ([], []))
    monkeypatch.setattr(rent_mod, "rent", lambda *a, **k: rent_mod.RentOutcome(
        reg.update("bench-1", job="j1"), None))

    def never(*a: Any, **k: Any) -> None:
        raise FleetError("not SSH-ready after 180s: bench-1")

    monkeypatch.setattr(rent_mod, "wait_ready", never)
    job = Job(Path("j.toml"), name="j1", command="true", outputs="out", ttl_minutes=30)
    s = oneshot.run(cfg, reg, {"vast": vast}, "bench", job)  # type: ignore[dict-item]
    assert s.problem and "not SSH-ready" in s.problem and s.destroyed and not s.kept
    assert vast.destroyed == ["42"]


# --- the guards at their edges: the deploy's, the pull's, the store's, the page's -------------

def _deploy_support(monkeypatch: pytest.MonkeyPatch, cfg: Config) -> None:
    from fleet.boxes import deploy_support
    monkeypatch.setattr(deploy_support, "config", lambda: cfg)


# --- a dry run records read_back for a job not yet staged ---------------------------------

def test_a_dry_run_writes_nothing_when_the_job_is_not_staged_yet(
        cfg: Config, reg: Registry, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(teardown, "_remote_job", lambda *a: {})  # deploy still installing
    before = dump(reg.path)
    teardown.teardown(cfg, reg, {"vast": Vast()}, "bench-1", dry_run=True)  # type: ignore[dict-item]
    row = reg.get("bench-1")
    assert row is not None
    # the promise: a dry run changes nothing, and j1 (about to run) still reads as unread
    assert unread(row), f"read_back={row.read_back}: `fleet destroy` now needs no --force"
    assert dump(reg.path) == before


# --- a later teardown that keeps the box leaves read_back set --------------------------------

class FailingDestroy(Vast):
    def destroy(self, box_id: str) -> None:
        raise ProviderError("vast", "destroy", "HTTP 500", "try again")


def _kept_after_a_failed_destroy(cfg: Config, reg: Registry,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Read back, its destroy failed; then a straggler wrote on, and the next teardown saw
    it and kept the box."""
    with pytest.raises(ProviderError):
        teardown.teardown(cfg, reg, {"vast": FailingDestroy()}, "bench-1")  # type: ignore[dict-item]
    monkeypatch.setattr(teardown, "_unchanged", lambda *a: ["r.json: written to after read"])
    with pytest.raises(teardown.KeptBox):
        teardown.teardown(cfg, reg, {"vast": Vast()}, "bench-1")  # type: ignore[dict-item]


def test_a_kept_box_whose_outputs_changed_is_unread_again(
        cfg: Config, reg: Registry, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    _kept_after_a_failed_destroy(cfg, reg, monkeypatch)
    row = reg.get("bench-1")
    assert row is not None and row.teardown and row.store_commit is None
    _deploy_support(monkeypatch, cfg)
    # the promise: what the teardown just refused to trust is not "read back"
    assert unread(row), "fleet destroy (no --force) and mark_job(j2) both pass now"


def test_no_second_job_after_a_teardown_that_kept_the_box(
        cfg: Config, reg: Registry, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    _kept_after_a_failed_destroy(cfg, reg, monkeypatch)
    _deploy_support(monkeypatch, cfg)
    with pytest.raises(FleetError, match="not read back"):
        oneshot.mark_job("bench-1", "j2", 30)


# --- the row changes between the read-back and the destroy --------------------------------

def test_a_job_given_after_the_read_back_is_never_destroyed(
        cfg: Config, reg: Registry, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    _deploy_support(monkeypatch, cfg)
    real = Registry.update
    refused: list[str] = []

    def update(self: Registry, label: str, **changes: Any) -> Any:
        row = real(self, label, **changes)
        if changes.get("read_back") == "j1":  # the deploy of j2 runs mark_job right now
            try:
                oneshot.mark_job("bench-1", "j2", 30)
            except FleetError as e:
                refused.append(str(e))
        return row

    monkeypatch.setattr(Registry, "update", update)
    vast = Vast()
    teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert refused and "a teardown of this box is under way" in refused[0]
    row = reg.get("bench-1")
    assert row is not None and row.job == "j1" and vast.destroyed == ["42"]


def test_a_row_that_names_another_job_at_the_destroy_keeps_the_box(
        cfg: Config, reg: Registry, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Registry.update

    def update(self: Registry, label: str, **changes: Any) -> Any:
        row = real(self, label, **changes)
        if changes.get("read_back") == "j1":  # a hand (or an older fleet) gives it j2 now
            real(self, label, job="j2", read_back=None)
        return row

    monkeypatch.setattr(Registry, "update", update)
    vast = Vast()
    with pytest.raises(FleetError, match="job changed"):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert vast.destroyed == []


def test_an_expired_pass_never_acts_on_a_flag_about_another_job(
        cfg: Config, reg: Registry, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    # a kept box (--keep-box) whose job j1 ended: the watchdog flags it due
    reg.update("bench-1", read_back="j1", store_commit="c" * 40, job_state="finished")
    row = reg.get("bench-1")
    assert row is not None
    assert watchdog.judge(row, {"phase": "finished"}, None, datetime.now(UTC)).due
    # ... then, before the --expired pass reaches it, the operator gives it job j2
    _deploy_support(monkeypatch, cfg)
    oneshot.mark_job("bench-1", "j2", 30)
    box.state = {"phase": "fetched", "invocations": 0}  # j2's deploy is between steps
    row = reg.get("bench-1")
    assert row is not None
    now = watchdog.judge(row, box.state, None, datetime.now(UTC))
    assert not now.due  # j2 is neither past its deadline nor ended: not due any more
    vast = Vast()
    with pytest.raises(FleetError, match="left alone"):  # what --expired does: the flagged job
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1",  # type: ignore[dict-item]
                          flagged_job="j1")
    assert vast.destroyed == [] and not any("job stop" in c for c in box.sent), \
        "the --expired pass stopped j2 and destroyed its box on a flag about j1"


# --- the watchdog's read lets non-FleetErrors out: the whole pass stops --------------------

def test_a_box_printing_bytes_that_are_not_utf8_is_unknown_not_a_crash(
        cfg: Config, reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boxssh, "argv", lambda cfg, row, cmd: [
        "sh", "-c", "printf '\\377\\376 motd' >&2; exit 1"])
    # the promise: unknown is not well, and one box's fault is one line; never a traceback
    ws = watchdog.watch(cfg, reg)
    assert ws and not ws[0].well


# --- an OSError on the operator's disk escapes `fleet run` and `fleet teardown` -------------

def test_archive_pull_turns_its_own_disk_errors_into_one_line(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"{}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        ti = tarfile.TarInfo("out/r.json")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
        import hashlib
        m = json.dumps([{"path": "r.json", "size": 2,
                         "sha256": hashlib.sha256(data).hexdigest()}]).encode()
        ti = tarfile.TarInfo("manifest.json")
        ti.size = len(m)
        t.addfile(ti, io.BytesIO(m))
    buf.seek(0)
    real = Path.write_text

    def full(self: Path, *a: Any, **k: Any) -> int:
        if self.name == archive.MANIFEST:
            raise OSError(28, "No space left on device")
        return real(self, *a, **k)
    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(FleetError):
        archive.pull(buf, tmp_path / "archive", "bench-1", "j1")


# --- the aside of a verified copy is deleted as a "leftover" -------------------------------

def _stream(files: dict[str, bytes], cut: bool = False) -> io.BytesIO:
    import hashlib
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        rows = []
        for name, data in files.items():
            ti = tarfile.TarInfo("out/" + name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
            rows.append({"path": name, "size": len(data),
                         "sha256": hashlib.sha256(data).hexdigest()})
        if not cut:
            m = json.dumps(rows).encode()
            ti = tarfile.TarInfo("manifest.json")
            ti.size = len(m)
            t.addfile(ti, io.BytesIO(m))
    raw = buf.getvalue()
    return io.BytesIO(raw if not cut else raw[:-1024])


def test_a_pull_killed_mid_swap_never_loses_the_verified_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arch = tmp_path / "archive"
    archive.pull(_stream({"r.json": b"v1"}), arch, "bench-1", "j1")  # a verified copy
    calls = {"n": 0}
    real = os.replace

    def crash(a: Any, b: Any) -> None:
        calls["n"] += 1
        real(a, b)
        if calls["n"] == 1:
            raise KeyboardInterrupt  # killed between the two renames
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        archive.pull(_stream({"r.json": b"v1"}), arch, "bench-1", "j1")
    monkeypatch.setattr(os, "replace", real)
    assert not (arch / "bench-1" / "j1").exists()  # the verified copy is set aside
    # the next teardown's pull is cut short (the box's ssh dropped)
    got = archive.pull(_stream({"r.json": b"v1"}, cut=True), arch, "bench-1", "j1")
    assert got.problems
    # the copy set aside is back in its place, untouched
    assert (arch / "bench-1" / "j1" / "outputs" / "r.json").read_bytes() == b"v1"
    assert json.loads((arch / "bench-1" / "j1" / archive.MANIFEST).read_text())[0]["size"] == 2


# --- the deadline mixes the box's clock with the operator's ---------------------------------

def test_a_box_whose_clock_is_behind_is_judged_by_its_own_clock(
        cfg: Config, reg: Registry, box: Box) -> None:
    lag = timedelta(hours=2)  # the box's clock runs 2 h behind the operator's
    real_start = datetime.now(UTC) - timedelta(minutes=5)
    box.state = {"phase": "running", "invocations": 1,
                 "started_at": (real_start - lag).timestamp(),
                 "deadline_at": iso(real_start - lag + timedelta(minutes=30)),
                 "box_now": (datetime.now(UTC) - lag).timestamp()}
    row = reg.get("bench-1")
    assert row is not None
    w = watchdog.judge(row, box.state, None, datetime.now(UTC))
    # 5 of 30 minutes have run on the box: not due, and a teardown must refuse
    assert not w.due, f"flagged due: {w.problems}"


def test_a_box_far_past_the_rents_deadline_is_never_well(
        cfg: Config, reg: Registry, box: Box) -> None:
    # the registry's deadline passed a day ago; the box (its clock, or a job that rewrote its
    # state.json as root) says its run ends in ten years
    reg.update("bench-1", expires_at=iso(datetime.now(UTC) - timedelta(days=1)))
    state = {"phase": "running", "invocations": 1,
             "deadline_at": iso(datetime.now(UTC) + timedelta(days=3650))}
    row = reg.get("bench-1")
    assert row is not None
    w = watchdog.judge(row, state, None, datetime.now(UTC))
    assert not w.well, "a box a day past the registry's deadline is judged well"


def test_a_dry_run_pins_no_host_key(cfg: Config, reg: Registry, box: Box,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    reg.update("bench-1", host_key=None)
    monkeypatch.setattr(lifecycle, "host_key_if_ready", lambda b: KEY)
    monkeypatch.setattr(teardown, "_manifest", lambda *a: [])
    before = dump(reg.path)
    teardown.teardown(cfg, reg, {"vast": Vast(ready=True)}, "bench-1",  # type: ignore[dict-item]
                      dry_run=True)
    assert dump(reg.path) == before, "a dry run pinned a key / recorded the box"


def test_a_job_seen_running_whose_files_vanished_keeps_the_box(
        cfg: Config, reg: Registry, box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    # fleet run recorded j1 finished with 1 invocation; now job.json is gone from the box
    # (the job's own code ran as root and cleaned its JOBDIR, or a hand) -> exit 7
    reg.update("bench-1", job_state="finished", invocations=1)
    monkeypatch.setattr(teardown, "_remote_job", lambda *a: {})
    vast = Vast()
    with pytest.raises(teardown.KeptBox, match="files are gone from the box"):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert vast.destroyed == [], "destroyed as 'never reached the box' after it ran"
