"""The pure parts of a publish: waves, the record's states, version order, the read-back check,
the release store, the CLI's refusals, and the sandbox node's never-sync knob."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.cli import publish_cmd
from fleet.core.errors import UsageError
from fleet.ops import publish as pub
from fleet.state import releases

# --- waves -----------------------------------------------------------------------------------

def test_waves_counts_shares_and_rest() -> None:
    boxes = [f"b{i:02d}" for i in range(10)]
    waves = pub.split_waves(boxes, "1,2,25%,rest")
    assert [len(w) for w in waves] == [1, 2, 3, 4]  # 25% of 10 rounds up to 3
    assert [x for w in waves for x in w] == boxes  # every box once, in order


def test_waves_without_rest_leave_no_box_behind_and_stop_when_boxes_run_out() -> None:
    assert pub.split_waves(["a", "b", "c", "d"], "1,1") == [["a"], ["b"], ["c", "d"]]
    assert pub.split_waves(["a", "b"], "1,5,rest") == [["a"], ["b"]]
    assert pub.split_waves([], "1,rest") == []
    assert pub.split_waves(["a", "b", "c"], "1%") == [["a"], ["b", "c"]]  # a share is >= 1 box


@pytest.mark.parametrize("spec", ["rest,1", "0", "x", "150%", "1,,2", "-1", "0%"])
def test_bad_waves_are_usage_errors(spec: str) -> None:
    with pytest.raises(UsageError, match="--waves"):
        pub.parse_waves(spec)


def test_the_canary_goes_first_and_the_rest_by_label() -> None:
    assert pub.order(["c", "a", "b"], "b") == ["b", "a", "c"]
    assert pub.order(["c", "a"], None) == ["a", "c"]
    assert pub.order(["c", "a"], "z") == ["a", "c"]  # a canary not pending is not invented


# --- versions --------------------------------------------------------------------------------

def test_versions_order_numerically_with_prereleases_first() -> None:
    key = releases.version_key
    assert key("1.10.0") > key("1.9.0") > key("1.5.0") > key("1.4.0")
    assert key("1.6.0rc1") < key("1.6.0") and key("1.6.0-rc1") == key("1.6.0rc1")
    with pytest.raises(UsageError, match="bad version"):
        key("latest")


# --- the record ------------------------------------------------------------------------------

def test_states_never_go_back_to_untouched() -> None:
    assert pub.next_state("untouched", "untouched") == "untouched"
    for s in pub.STATES:
        assert pub.next_state("untouched", s) == s
        assert pub.next_state(s, "switched") == "switched"
    for s in set(pub.STATES) - {"untouched"}:
        with pytest.raises(ValueError, match="cannot become untouched"):
            pub.next_state(s, "untouched")
    with pytest.raises(ValueError, match="unknown state"):
        pub.next_state("untouched", "done")


def test_record_round_trip_history_and_outcome(tmp_path: Path) -> None:
    path = tmp_path / "1.5.0" / "publish.json"
    rec = pub.Record.load(path, "1.5.0", "a" * 16)
    assert rec.state("x") == "untouched"
    rec.set("x", "reverted", "not healthy", wave=1)
    rec.set("y", "switched", "", wave=1)
    assert rec.outcome(["x", "y"]) == "incomplete"
    rec.save()
    again = pub.Record.load(path, "1.5.0", "a" * 16)
    assert again.state("x") == "reverted" and again.boxes["x"]["wave"] == 1
    again.set("x", "switched", "", wave=2)
    assert again.outcome(["x", "y"]) == "done"
    assert [h[1] for h in again.boxes["x"]["history"]] == ["reverted", "switched"]
    # no temporary file is left beside the record
    assert sorted(p.name for p in path.parent.iterdir()) == ["publish.json"]
    # a record of another build of the version starts over
    assert pub.Record.load(path, "1.5.0", "b" * 16).boxes == {}


def test_a_corrupt_record_is_not_reset(tmp_path: Path) -> None:
    path = tmp_path / "publish.json"
    path.write_text("{half")
    with pytest.raises(pub.FleetError, match="not valid JSON"):
        pub.Record.load(path, "1.5.0", "a" * 16)
    assert path.read_text() == "{half"


# --- the read-back check ---------------------------------------------------------------------

def _store(tmp_path: Path) -> list[releases.Release]:
    out = []
    for v in ("1.4.0", "1.5.0", "1.6.0"):
        src = tmp_path / "src" / v
        src.mkdir(parents=True)
        for name in releases.FILES:
            (src / name).write_text(f"#!/bin/sh\n# {name} {v}\n")
        out.append(releases.add(tmp_path / "store", src, v)[0])
    return out


def _rb(rel: releases.Release, **over: Any) -> dict[str, Any]:
    node = {"pid": 10, "exe_kind": "script", "path": f"/root/fleet/releases/{rel.node_sha16}/"
            "igneumd", "sha256": rel.node_sha256, "started_at": "2026-12-02T10:00:05Z",
            "version": rel.version, "synced": True}
    rb: dict[str, Any] = {
        "node": node,
        "miner": {"pid": 11, "exe_kind": "script", "path": "m", "sha256": rel.sha256[
            releases.MINER_BINARY]},
        "prover": {"pid": 12, "exe_kind": "script", "path": "p", "sha256": rel.sha256[
            releases.PROVER_BINARY]},
        "pointer": {"target": node["path"], "sha256": rel.node_sha256,
                    "target_sha256": rel.node_sha256, "written_at": "2026-12-02T10:00:00Z"},
        "started_after_pointer": True,
        "switch": {"from_sha16": "0" * 16, "to_sha16": rel.node_sha16,
                   "applied_at": "2026-12-02T10:00:00Z", "old_exit_at": "2026-12-02T10:00:01Z",
                   "new_started_at": "2026-12-02T10:00:02Z",
                   "synced_at": "2026-12-02T10:00:03.5Z", "downtime_s": 2.5},
    }
    for k, v in over.items():
        if k.startswith("node_"):
            rb["node"][k[5:]] = v
        else:
            rb[k] = v
    return rb


def test_a_matching_row_passes_and_each_mismatch_is_named(tmp_path: Path) -> None:
    old, new, _ = known = _store(tmp_path)
    assert pub.check_row(new, known, _rb(new)) == []
    # miner and prover of the release the box was converted with are fine
    mixed = _rb(new, miner=_rb(old)["miner"])
    assert pub.check_row(new, known, mixed) == []
    cases = {
        "node: runs": _rb(new, node_sha256=old.node_sha256),
        "reports version 1.4.0": _rb(new, node_version="1.4.0"),
        "status RPC did not answer": _rb(new, node_version=None),
        "not synced": _rb(new, node_synced=False),
        "did not start after the pointer": _rb(new, started_after_pointer=False),
        "pointer: absent": _rb(new, pointer=None),
        "miner: runs": _rb(new, miner={"sha256": "f" * 64}),
    }
    for words, rb in cases.items():
        problems = pub.check_row(new, known, rb)
        assert any(words in p for p in problems), (words, problems)
    assert pub.check_row(new, known, _rb(new, node=None)) == ["node: not running"]


def test_preflight_compares_with_what_runs(tmp_path: Path) -> None:
    old, new, newer = known = _store(tmp_path)
    assert pub.preflight(new, known, None, False)[0] == "unreachable"
    assert pub.preflight(new, known, {}, False)[0] == "failed"
    assert pub.preflight(new, known, _rb(new), False) == ("switched", "runs the release", False)
    assert pub.preflight(new, known, _rb(old), False) == ("untouched", "runs 1.4.0", True)
    state, note, go = pub.preflight(new, known, _rb(newer), False)
    assert (state, go) == ("ahead", False) and "1.6.0" in note
    assert pub.preflight(new, known, _rb(newer), True)[2] is True
    state, note, go = pub.preflight(new, known, _rb(new, node_sha256="e" * 64), False)
    assert (state, go) == ("ahead", False) and "no release in the store" in note
    state, note, go = pub.preflight(new, known, _rb(new, node=None), False)
    assert (state, go) == ("failed", False)


def test_classify_after_a_wave(tmp_path: Path) -> None:
    old, new, newer = known = _store(tmp_path)
    assert pub.classify(new, known, _rb(new)) == ("switched", "")
    # the agent put the old pointer back: its last timeline runs from the new to the old
    reverted = _rb(old, switch={"from_sha16": new.node_sha16, "to_sha16": old.node_sha16})
    state, note = pub.classify(new, known, reverted)
    assert state == "reverted" and "1.4.0" in note
    assert pub.classify(new, known, _rb(old, switch=None))[0] == "failed"
    assert pub.classify(new, known, None)[0] == "unreachable"
    assert pub.classify(new, known, _rb(newer))[0] == "ahead"
    state, note = pub.classify(new, known, _rb(new, node_synced=False))
    assert state == "failed" and "not synced" in note


def test_table_row_reports_downtime_and_the_kind_of_file(tmp_path: Path) -> None:
    _, new, _ = known = _store(tmp_path)
    row = pub.table_row("box-a", "vast", "switched", "", _rb(new), new, known)
    assert row["matches_manifest"] and row["downtime_s"] == 2.5 and row["synced_after_s"] == 3.5
    assert row["gap_s"] == 1.0
    assert row["miner_version"] == "1.5.0" and row["node_kind"] == "script"
    cells = publish_cmd.cells(row)
    assert cells[0] == "box-a" and cells[-1] == "ok" and "(script)" in cells[3]
    bad = pub.table_row("box-b", "vast", "switched", "", _rb(new, node_synced=False), new, known)
    assert publish_cmd.cells(bad)[-1].startswith("MISMATCH: node: not synced")


# --- the store -------------------------------------------------------------------------------

def test_release_add_is_atomic_idempotent_and_immutable(tmp_path: Path) -> None:
    old, new, _ = _store(tmp_path)
    store = tmp_path / "store"
    manifest = json.loads((store / "releases.json").read_text())
    assert [r["version"] for r in manifest] == ["1.4.0", "1.5.0", "1.6.0"]
    assert manifest[1]["files"]["igneumd"] == {
        "sha256": new.node_sha256, "sha16": new.node_sha16,
        "size": (store / "1.5.0" / "igneumd").stat().st_size}
    assert not list(store.glob("*.partial")) and os.access(store / "1.5.0" / "igneumd", os.X_OK)
    again, changed = releases.add(store, tmp_path / "src" / "1.5.0", "1.5.0")
    assert not changed and again == new
    with pytest.raises(UsageError, match="immutable"):
        releases.add(store, tmp_path / "src" / "1.6.0", "1.5.0")
    with pytest.raises(UsageError, match="node binary"):
        releases.add(store, tmp_path / "src" / "1.6.0", "1.7.0")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="missing igneumd"):
        releases.add(store, tmp_path / "empty", "1.8.0")
    assert releases.verify(old) == []
    (store / "1.4.0" / "igneum-prover").unlink()
    assert releases.verify(releases.find(store, "1.4.0")) == [
        f"igneum-prover: missing ({store / '1.4.0' / 'igneum-prover'})"]
    with pytest.raises(UsageError, match="not usable"):
        releases.check_usable(releases.find(store, old.node_sha16))


def test_the_sandbox_store_is_read_by_the_fleets_reader(tmp_path: Path) -> None:
    from sandbox.releases import build_store

    built = build_store(tmp_path / "built")
    got = releases.import_built(tmp_path / "store", [(r.version, r.path) for r in built])
    assert [r.node_sha16 for r in got] == [r.node_sha16 for r in built]
    # the same builds again change nothing; a publish record in a version folder stays
    (tmp_path / "store" / "1.5.0" / "publish.json").write_text("{}")
    releases.import_built(tmp_path / "store", [(r.version, r.path) for r in built])
    assert (tmp_path / "store" / "1.5.0" / "publish.json").read_text() == "{}"
    assert releases.load(tmp_path / "store") == releases.load(tmp_path / "store")


# --- the CLI ---------------------------------------------------------------------------------

CONFIG = """
[fleet]
registry = "state/boxes.json"
releases = "state/releases"
daily_budget_usd = 10
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
"""


def _fleet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "fleet.toml").write_text(CONFIG)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RUNPOD_", "VAST_", "FLEET_"))}
    env.update(FLEET_CONFIG=str(tmp_path / "fleet.toml"), HOME=str(tmp_path), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "fleet.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def test_release_add_and_list(tmp_path: Path) -> None:
    src = tmp_path / "build"
    src.mkdir()
    for name in releases.FILES:
        (src / name).write_text(f"{name} 2.0.0\n")
    r = _fleet(tmp_path, "release", "add", str(src), "--version", "2.0.0")
    assert r.returncode == 0 and "added release 2.0.0" in r.stdout, r.stderr
    listed = json.loads(_fleet(tmp_path, "release", "list", "--json").stdout)
    assert [x["version"] for x in listed] == ["2.0.0"] and listed[0]["problems"] == []
    r = _fleet(tmp_path, "release", "add", str(src), "--version", "2.0.0")
    assert r.returncode == 0 and "already recorded" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["publish", "9.9.9"], "error: no release '9.9.9'"),
    (["release", "add", "nowhere", "--version", "1.0.0"], "error: nowhere: not a folder"),
    (["publish", "1.0.0", "--waves", "rest,1"], "error: --waves"),
    (["publish", "1.0.0", "--canary", "Bad Label"], "error: bad label"),
    (["publish", "1.0.0"], "error: release 1.0.0 in"),  # its files went missing
])
def test_bad_publish_input_is_one_line_exit_2(tmp_path: Path, args: list[str],
                                              message: str) -> None:
    src = tmp_path / "build"
    src.mkdir()
    for name in releases.FILES:
        (src / name).write_text(f"{name} 1.0.0\n")
    store = tmp_path / "state" / "releases"
    releases.add(store, src, "1.0.0")
    if args[-1] == "1.0.0" and len(args) == 2:
        (store / "1.0.0" / "igneumd").unlink()
    before = sorted(str(p) for p in (tmp_path / "state").rglob("*"))
    r = _fleet(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr
    assert sorted(str(p) for p in (tmp_path / "state").rglob("*")) == before


# --- the sandbox node's knob -----------------------------------------------------------------

def test_a_never_sync_version_stays_behind_and_others_sync(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.sim import igneumd

    knobs = {**igneumd.DEFAULT_KNOBS, "network_height": 100, "sync_blocks_per_s": 1000.0,
             "never_sync_versions": ["1.5.0"]}
    for version, synced in (("1.5.0", False), ("1.4.0", True)):
        monkeypatch.setattr(igneumd, "VERSION", version)
        chain = igneumd.Chain(tmp_path / f"{version}.json", knobs)
        for _ in range(20):
            chain.tick(0.1, knobs, 0)
        assert chain.synced is synced, version
        assert chain.status(knobs, 0)["synced"] is synced
        assert chain.height >= chain.network - 1.0  # caught up to within a block either way


# --- fleet check after a publish -------------------------------------------------------------

def test_check_names_a_box_behind_its_wanted_release(tmp_path: Path) -> None:
    from check_fixture import DATA, status

    from fleet.ops.check import judge

    old, new, newer = known = _store(tmp_path)
    s = status(node={"sha16": old.node_sha16, "rpc": {"synced": True, "blocks": 1300,
                                                      "exec_tip": 1298},
                     "rpc_at": "2026-12-02T10:00:00Z"})
    h = judge("b", DATA, s, new.node_sha16, None, known)
    assert f"node: behind: runs 1.4.0 ({old.node_sha16}), wanted 1.5.0 ({new.node_sha16})" \
        in h.problems and not h.well
    ahead = judge("b", DATA, s, old.node_sha16, None, known)  # on the wanted one: well
    assert ahead.well
    s["node"]["sha16"] = newer.node_sha16
    assert any(p.startswith("node: ahead: runs 1.6.0") for p in judge(
        "b", DATA, s, new.node_sha16, None, known).problems)
