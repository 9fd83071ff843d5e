"""What the teardown trusts and what keeps a box: the outputs folder from the row (never the
box's job.json, which the job can rewrite), a missing outputs folder kept with a reason,
every kept box's reason on its row and in `fleet check`, a box kept for a lasting reason not
pulled again by `--expired`, a pull past its deadline stopped, and two teardowns pushing to one
store repository at once both destroyed.

The "box" is a local folder in the box's layout: every command the teardown sends runs there
through bash (the real `python -m agent manifest`, tar stream and all), in place of ssh. The
job's state is the stand-in the other teardown tests use; the archive, the store (the
sandbox's Hub server, through huggingface_hub), the registry and the locks are the real ones.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hub_client import TOKEN
from repo_root import ROOT as REPO_ROOT

from agent.contract import JOBS, ROOT, job_area, job_workdir
from fleet.boxes import boxssh
from fleet.cli.check_cmd import watch_row
from fleet.core.boxes import Row
from fleet.core.config import Config, parse
from fleet.core.errors import FleetError
from fleet.ops import oneshot, teardown, watchdog
from fleet.providers import store
from fleet.state import archive
from fleet.state.registry import Registry
from sandbox.hub import HubServer

CONFIG = {
    "fleet": {"registry": "state/boxes.json"},
    "store": {"repo": "fleet/outputs", "archive": "state/archive"},
    "roles": {"bench": {"kind": "oneshot", "image": "img", "disk_gb": 20,
                        "admitted_driver": "580.95.05"}},
}
RESULTS = b'{"gflops": 1234.5}\n'


class Vast:
    name = "vast"

    def __init__(self) -> None:
        self.destroyed: list[str] = []

    def destroy(self, box_id: str) -> None:
        self.destroyed.append(box_id)

    def box(self, box_id: str) -> None:
        return None  # gone once destroyed


class LocalBox:
    """The box's filesystem under `root`; each command sent to it runs there, by bash."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sent: list[str] = []
        self.stall = False  # the link stalls: part of the stream, then nothing, never an end
        venv = root / "venv" / "bin"
        venv.mkdir(parents=True)
        (venv / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (venv / "python").chmod(0o755)

    def argv(self, cfg: Config, row: Row, command: str) -> list[str]:
        self.sent.append(command)
        # the box's root and its job area (agent.contract.job_area), both in the test's folder
        local = command.replace(job_area(ROOT), str(self.root / "area")).replace(ROOT,
                                                                             str(self.root))
        if self.stall and "--tar" in local:
            local = f"{{ {local}; }} | head -c 3000; exec sleep 3600"
        return ["bash", "-c", local]

    def workdir(self, job: str) -> Path:
        return self.root / "area" / job

    def pulls(self) -> int:
        return sum(1 for c in self.sent if "--tar" in c)


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return parse(CONFIG, tmp_path / "fleet.toml")


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "state" / "boxes.json")


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalBox:
    b = LocalBox(tmp_path / "box")
    monkeypatch.setattr(boxssh, "argv", b.argv)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    return b


def place(reg: Registry, box: LocalBox, label: str, job: str, outputs: str | None = "out",
          files: dict[str, bytes] | None = None) -> None:
    """A finished job on the box, its outputs in `out/`, and its row as the operator recorded
    it (`outputs`)."""
    reg.add(Row(label=label, provider="vast", role="bench", kind="oneshot", card="RTX 4090",
                gpu_count=1, usd_per_hour=0.4, status="running", provider_id=f"id-{label}",
                job=job, outputs=outputs, host_key="ssh-ed25519 AAAA"))
    (box.root / JOBS / job).mkdir(parents=True, exist_ok=True)  # the agent's records
    out = box.workdir(job) / "out"
    out.mkdir(parents=True, exist_ok=True)
    for rel, data in (files if files is not None else {"results.json": RESULTS}).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)


@pytest.fixture(autouse=True)
def job_state(monkeypatch: pytest.MonkeyPatch) -> None:
    def remote_job(cfg: Config, row: Row, job: str) -> dict[str, Any]:
        spec = {"name": job, "outputs": "out", "ttl_minutes": 30}
        return {"spec": spec, "state": {"phase": "finished", "invocations": 1},
                "box_now": datetime.now(UTC).timestamp()}

    monkeypatch.setattr(teardown, "_remote_job", remote_job)


def archived(cfg: Config, label: str, job: str) -> dict[str, bytes]:
    root = archive.folder(teardown.archive_dir(cfg), label, job) / archive.OUTPUTS
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def kept(reg: Registry, label: str) -> Row:
    row = reg.get(label)
    assert row is not None and row.live and row.read_back is None, row
    return row


# --- the outputs folder is the operator's, never the box's job.json -------------------------

def test_the_outputs_are_read_from_the_folder_the_row_names_not_the_boxs_job_json(
        cfg: Config, reg: Registry, box: LocalBox, hub: HubServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the job rewrote its job.json: `outputs` now names `logs`, a folder it never made
    place(reg, box, "bench-1", "j1", outputs="out")
    monkeypatch.setattr(teardown, "_remote_job", lambda cfg, row, job: {
        "spec": {"name": job, "outputs": "logs", "ttl_minutes": 30},
        "state": {"phase": "finished", "invocations": 1}})
    vast = Vast()
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert out.destroyed and out.files == 1, out
    assert archived(cfg, "bench-1", "j1") == {"results.json": RESULTS}


def test_the_deploy_records_the_jobs_outputs_folder_on_the_row_when_it_places_the_job(
        cfg: Config, reg: Registry, box: LocalBox, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.boxes import deploy_support

    monkeypatch.setattr(deploy_support, "config", lambda: cfg)
    place(reg, box, "bench-1", "j1", outputs=None)  # a row written before rows named it
    reg.update("bench-1", expires_at="2099-01-01T00:00:00Z")
    oneshot.mark_job("bench-1", "j1", 30, outputs="out")  # the same job, deployed again
    row = reg.get("bench-1")
    assert row is not None and row.outputs == "out" and row.expires_at == "2099-01-01T00:00:00Z"
    oneshot.mark_job("bench-1", "j1", 30, outputs="elsewhere")  # the first placement holds
    assert (reg.get("bench-1") or row).outputs == "out"
    reg.update("bench-1", read_back="j1")
    oneshot.mark_job("bench-1", "j2", 30, outputs="results")  # the next job, its own folder
    row = reg.get("bench-1")
    assert row is not None and (row.job, row.outputs) == ("j2", "results")


def test_a_row_that_names_no_outputs_folder_keeps_the_box_without_reading_it(
        cfg: Config, reg: Registry, box: LocalBox, hub: HubServer) -> None:
    place(reg, box, "bench-1", "j1", outputs=None)  # a row written before rows named it
    vast = Vast()
    with pytest.raises(teardown.KeptBox, match="names no outputs folder"):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    row = kept(reg, "bench-1")
    assert vast.destroyed == [] and box.pulls() == 0
    assert row.teardown == "kept: the row names no outputs folder for job j1"


def test_a_missing_outputs_folder_on_the_box_is_not_zero_outputs(
        cfg: Config, reg: Registry, box: LocalBox, hub: HubServer) -> None:
    place(reg, box, "bench-1", "j1")
    (box.workdir("j1") / "out").rename(box.workdir("j1") / "logs")  # the job renamed it
    vast = Vast()
    with pytest.raises(teardown.KeptBox, match="not a folder on the box"):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    row = kept(reg, "bench-1")
    assert vast.destroyed == [] and row.teardown is not None
    assert row.teardown == f"kept: no outputs folder {job_workdir(ROOT, 'j1')}/out on the box"
    assert not archive.folder(teardown.archive_dir(cfg), "bench-1", "j1").exists()


# --- every kept box's reason is on its row, and `fleet check` shows it ------------------------

def _unreadable_job(cfg: Config, row: Row, job: str) -> dict[str, Any]:
    raise FleetError(f"{row.label}: `ssh ...` did not answer within 120s")


@pytest.mark.parametrize(("cause", "says"), [
    ("ssh", "did not answer within 120s"),
    ("archive", "cannot make room for the outputs"),
    ("store", "the push to the store failed"),
])
def test_every_reason_a_teardown_keeps_a_box_is_on_its_row_and_in_fleet_check(
        cfg: Config, reg: Registry, box: LocalBox, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, cause: str, says: str) -> None:
    place(reg, box, "bench-1", "j1")
    if cause == "ssh":
        monkeypatch.setattr(teardown, "_remote_job", _unreadable_job)
    elif cause == "archive":  # the archive's folder for the label cannot be made
        (tmp_path / "state" / "archive").mkdir(parents=True)
        (tmp_path / "state" / "archive" / "bench-1").write_text("a file in its place")
    else:  # no store at all: HF_ENDPOINT points nowhere
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    vast = Vast()
    with pytest.raises(FleetError):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    row = kept(reg, "bench-1")
    assert vast.destroyed == [] and row.teardown is not None and says in row.teardown, row
    w = watchdog.judge(row, {"phase": "finished"}, None, datetime.now(UTC))
    assert not w.well and says in watch_row(w)["verdict"]


def test_a_store_that_fails_keeps_the_box_without_saying_the_copies_differ(
        cfg: Config, reg: Registry, box: LocalBox, monkeypatch: pytest.MonkeyPatch) -> None:
    place(reg, box, "bench-1", "j1")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(teardown.KeptBox) as e:
        teardown.teardown(cfg, reg, {"vast": Vast()}, "bench-1")  # type: ignore[dict-item]
    assert "do not match" not in str(e.value) and "cannot reach the store" in str(e.value)


# --- a box kept for a lasting reason is not pulled again until something changes ------------

def test_a_box_kept_for_a_link_is_not_pulled_again_by_expired_until_it_is_fixed(
        cfg: Config, reg: Registry, box: LocalBox, hub: HubServer) -> None:
    place(reg, box, "bench-1", "j1")
    os.symlink("results.json", box.workdir("j1") / "out" / "latest")
    vast = Vast()
    with pytest.raises(teardown.KeptBox, match="latest: a link to results.json"):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert box.pulls() == 1 and kept(reg, "bench-1").kept_lasting == "j1"
    for _ in range(3):  # the --expired passes from cron: no pull, the same reason
        with pytest.raises(teardown.KeptBox, match="not read again until that changes"):
            teardown.teardown(cfg, reg, {"vast": vast}, "bench-1",  # type: ignore[dict-item]
                              flagged_job="j1")
    assert box.pulls() == 1 and vast.destroyed == []
    assert "latest: a link to results.json" in (kept(reg, "bench-1").teardown or "")
    # the operator's fix: the file in the link's place; a teardown by name reads it again
    (box.workdir("j1") / "out" / "latest").unlink()
    (box.workdir("j1") / "out" / "latest").write_bytes(RESULTS)
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert out.destroyed and box.pulls() == 2
    assert archived(cfg, "bench-1", "j1") == {"latest": RESULTS, "results.json": RESULTS}


def test_a_box_kept_for_a_passing_reason_is_pulled_again_by_expired(
        cfg: Config, reg: Registry, box: LocalBox, hub: HubServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    place(reg, box, "bench-1", "j1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the store is down for a while
    vast = Vast()
    with pytest.raises(teardown.KeptBox, match="the push to the store failed"):
        teardown.teardown(cfg, reg, {"vast": vast}, "bench-1")  # type: ignore[dict-item]
    assert kept(reg, "bench-1").kept_lasting is None
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    out = teardown.teardown(cfg, reg, {"vast": vast}, "bench-1",  # type: ignore[dict-item]
                            flagged_job="j1")
    assert out.destroyed and box.pulls() == 2


# --- a pull has an overall deadline -------------------------------------------------------

def test_a_pull_that_stalls_is_stopped_at_its_deadline_and_leaves_no_partial_copy(
        cfg: Config, reg: Registry, box: LocalBox, monkeypatch: pytest.MonkeyPatch) -> None:
    place(reg, box, "bench-1", "j1", files={"big.bin": os.urandom(1 << 20)})
    box.stall = True
    monkeypatch.setattr(teardown, "PULL_DEADLINE_S", 2.0)
    caught: list[BaseException] = []

    def tear() -> None:
        try:
            teardown.teardown(cfg, reg, {"vast": Vast()}, "bench-1")  # type: ignore[dict-item]
        except BaseException as e:  # noqa: BLE001 - reported below
            caught.append(e)

    t = threading.Thread(target=tear, daemon=True)
    t.start()
    t.join(timeout=120)  # a bound for a pull that never ends; the deadline is 2 s
    assert not t.is_alive(), "the pull is still waiting on a stalled box"
    assert len(caught) == 1 and isinstance(caught[0], teardown.KeptBox), caught
    assert "took longer than 2 s" in str(caught[0])
    assert "took longer than" in (kept(reg, "bench-1").teardown or "")
    assert [p.name for p in (teardown.archive_dir(cfg) / "bench-1").iterdir()] == []


# --- two teardowns pushing to one store repository at once ------------------------------------

def test_two_teardowns_pushing_to_one_repository_at_once_both_destroy_their_box(
        cfg: Config, reg: Registry, box: LocalBox, hub: HubServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for n in (1, 2):
        place(reg, box, f"bench-{n}", f"j{n}", files={"results.json": b"%d\n" % n})
    real_head = store._head
    both_read = threading.Barrier(2)
    waited: set[int] = set()

    def read_together(api: Any, repo: str) -> str | None:
        head = real_head(api, repo)
        me = threading.get_ident()
        if me not in waited:  # each push's first read of the head: both read the same one
            waited.add(me)
            both_read.wait(timeout=60)
        return head

    monkeypatch.setattr(store, "_head", read_together)
    vast = Vast()
    done: dict[str, Any] = {}

    def tear(label: str) -> None:
        try:
            done[label] = teardown.teardown(
                cfg, reg, {"vast": vast}, label)  # type: ignore[dict-item]
        except BaseException as e:  # noqa: BLE001 - reported below
            done[label] = e

    threads = [threading.Thread(target=tear, args=(f"bench-{n}",)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert all(isinstance(o, teardown.Outcome) and o.destroyed for o in done.values()), done
    assert sorted(vast.destroyed) == ["id-bench-1", "id-bench-2"]
    monkeypatch.setattr(store, "_head", real_head)
    head = store.head("fleet/outputs") or ""
    for n in (1, 2):
        data = b"%d\n" % n
        manifest = [{"path": "results.json", "size": len(data),
                     "sha256": hashlib.sha256(data).hexdigest()}]
        assert store.read_back("fleet/outputs", head, f"j{n}/bench-{n}", manifest) == []

