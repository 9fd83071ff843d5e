"""The documents the agent's CLI prints have exactly the keys `agent.contract`'s TypedDicts
declare: each is produced here by the agent's own code (a running agent's status, its
read-back, a job's state, a manifest, a storage review) and held against its TypedDict, every
required key present and no key undeclared, down through the nested documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

from agentbox import Box, wait_for
from jobtools import job, state_of, write_job

from agent import contract

JSON = str | int | float | bool | None | list[Any] | dict[str, Any]


def _typeddict(hint: Any) -> Any:
    return hint if typing.is_typeddict(hint) else None


def problems(doc: Any, td: Any, where: str = "") -> list[str]:
    """How `doc` differs from the TypedDict `td` (keys, and nested TypedDicts: a value typed
    `TD`, `TD | None`, `list[TD]` or `dict[str, TD]`)."""
    if not isinstance(doc, dict):
        return [f"{where or '.'}: {type(doc).__name__}, not an object"]
    keys = td.__required_keys__ | td.__optional_keys__
    out = [f"{where}.{k}: missing" for k in sorted(td.__required_keys__ - doc.keys())]
    out += [f"{where}.{k}: not in {td.__name__}" for k in sorted(doc.keys() - keys)]
    hints = typing.get_type_hints(td)
    for key in sorted(doc.keys() & keys):
        out += _value_problems(doc[key], hints[key], f"{where}.{key}")
    return out


def _value_problems(value: Any, hint: Any, where: str) -> list[str]:
    if value is None:
        return []
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _value_problems(value, inner[0], where) if len(inner) == 1 else []
    if _typeddict(hint):
        return problems(value, hint, where)
    if origin is list and args and _typeddict(args[0]):
        return [p for i, v in enumerate(value) for p in problems(v, args[0], f"{where}[{i}]")]
    if origin is dict and len(args) == 2 and _typeddict(args[1]):
        return [p for k, v in value.items() for p in problems(v, args[1], f"{where}[{k}]")]
    return []


def test_the_checker_sees_a_missing_and_an_undeclared_key() -> None:
    doc = {"free_bytes": {}, "total_bytes": {}, "surprise": 1}
    assert problems(doc, contract.DiskDoc) == [".full: missing", ".surprise: not in DiskDoc"]
    nested = {"path": "a", "size": "x"}
    assert problems(nested, contract.ManifestEntry) == []  # only keys are held, not values


def _cli(box: Box, *args: str) -> Any:
    return json.loads(box.agent_cli(*args).stdout)


def test_a_running_agents_status_and_readback_are_the_contracts_documents(box: Box) -> None:
    box.set_node_state(synced=True, blocks=1234, peers=2, peers_in=1, peers_out=1,
                       peer_list=[{"dir": "in", "remote": "10.0.0.2:16111", "public": True}])
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure()
    box.start_agent()
    wait_for(lambda: box.status()["node"]["rpc"] and all(
        p["state"] == contract.ProgramState.RUNNING for p in box.status()["programs"].values()),
        "every program running and the node's RPC read")
    written = box.status()
    assert problems(written, contract.StatusFile) == []
    assert set(written["programs"]) == set(contract.PROGRAMS)
    printed = _cli(box, "status", "--config", str(box.config_path))
    assert problems(printed, contract.StatusDoc) == []
    assert printed["alive"] is True
    readback = _cli(box, "readback", "--config", str(box.config_path))
    assert problems(readback, contract.ReadbackDoc) == []
    assert readback[contract.NODE] is not None and readback["pointer"] is not None


def test_the_status_before_any_agent_ran_is_a_status_document(box: Box) -> None:
    box.configure()
    printed = _cli(box, "status", "--config", str(box.config_path))
    assert printed["error"] == "no status yet" and printed["alive"] is False
    assert problems(printed, contract.StatusDoc) == []


def test_a_jobs_state_is_the_contracts_job_state(box: Box) -> None:
    jobdir = write_job(box)
    before = state_of(job(box, "state", jobdir))
    assert before["phase"] == contract.JobPhase.NEW
    assert problems(before, contract.JobStateDoc) == []
    admitted = state_of(job(box, "admit", jobdir))
    assert admitted["phase"] == contract.JobPhase.ADMITTED
    assert problems(admitted, contract.JobStateDoc) == []
    on_disk = json.loads((jobdir / contract.JOB_STATE).read_text())
    assert problems(on_disk, contract.JobStateFile) == []
    assert "deadline_at" not in on_disk  # only printed, never recorded


def test_a_stop_is_the_contracts_stop_and_the_one_a_teardown_writes(box: Box) -> None:
    jobdir = write_job(box, name="stopped")
    job(box, "stop", jobdir, "--grace", "0")
    written = json.loads((jobdir / contract.JOB_STOP).read_text())
    assert problems(written, contract.StopDoc) == []
    # the teardown closing a job that never reached the box writes the same document
    assert written.keys() == contract.stop_document(0.0, 0).keys()
    assert written["by"] == contract.stop_document(0.0, 0)["by"]


def _outputs(tmp: Path) -> Path:
    out = tmp / "out"
    out.mkdir()
    (out / "a.txt").write_bytes(b"a")
    (out / "link").symlink_to("a.txt")
    os.mkfifo(out / "pipe")
    return out


def test_every_manifest_entry_is_a_manifest_entry(tmp_path: Path) -> None:
    out = _outputs(tmp_path)
    done = subprocess.run([sys.executable, "-m", "agent", "manifest", str(out)],
                          capture_output=True, text=True, timeout=60, check=True)
    entries = json.loads(done.stdout)
    assert [e["path"] for e in entries] == ["a.txt", "link", "pipe"]
    assert [p for e in entries for p in problems(e, contract.ManifestEntry)] == []
    saved = tmp_path / "manifest.json"
    subprocess.run([sys.executable, "-m", "agent", "manifest", str(out), "--tar", "--save",
                    str(saved)], capture_output=True, timeout=60, check=True)
    streamed = json.loads(saved.read_text())
    assert "mtime_ns" in streamed[0]
    assert [p for e in streamed for p in problems(e, contract.ManifestEntry)] == []


def test_a_storage_review_is_the_contracts_review(box: Box) -> None:
    box.configure()
    (box.root / "log").mkdir(parents=True, exist_ok=True)
    (box.root / "log" / "agent.log.1").write_text("old\n")
    review = _cli(box, "storage", "--json", "--config", str(box.config_path))
    assert review["categories"], review
    assert problems(review, contract.StorageReview) == []


def test_a_switch_prints_the_contracts_switch_document(box: Box) -> None:
    box.configure()
    done = box.agent_cli("switch", "--config", str(box.config_path), "--node",
                         str(box.root / "releases" / "none" / "node"), "--sha256", "0" * 64,
                         check=False)
    printed = json.loads(done.stdout)
    assert printed["outcome"] == contract.SwitchOutcome.REFUSED
    assert done.returncode == contract.SWITCH_EXIT[contract.SwitchOutcome.REFUSED]
    assert problems(printed, contract.SwitchDoc) == []


def test_a_switch_that_happened_is_recorded_as_the_contracts_switch_record(box: Box) -> None:
    box.set_node_state(synced=True, blocks=1500, exec_tip=1400)
    path1, sha1 = box.release("v1")
    box.point(path1, sha1)
    box.configure()
    box.start_agent()
    wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("version") == "v1", "v1 answering")
    path2, sha2 = box.release("v2")
    done = box.agent_cli("switch", "--config", str(box.config_path), "--node", str(path2),
                         "--sha256", sha2, "--stable-s", "0.5", "--deadline-s", "60")
    printed = json.loads(done.stdout)
    assert printed["outcome"] == contract.SwitchOutcome.SWITCHED, printed
    assert problems(printed, contract.SwitchDoc) == []
    readback = wait_for(lambda: (rb := _cli(box, "readback", "--config", str(box.config_path)))
                        ["switch"] and rb["switch"]["synced_at"] and rb, "the switch's timeline")
    assert problems(readback, contract.ReadbackDoc) == []
    written = wait_for(lambda: (s := box.status())["node"]["switch"]
                       and s["node"]["switch"]["synced_at"] and s, "the switch in the status")
    assert problems(written, contract.StatusFile) == []
