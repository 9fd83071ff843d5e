"""The storage review and clean on a box's root (agent/space.py, `python -m agent storage`):
the review lists each category and changes nothing; the clean frees what it promised, skips a
file changed since the review, refuses what the rules keep whatever the review says, and never
touches the running, previous or wanted release, current logs or job outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from repo_root import ROOT as REPO

from agent import space


def put(path: Path, size: int = 4096) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def record(root: Path, previous: str, to: str) -> None:
    """The previous-release record `agent switch` leaves when it moves the pointer from
    releases/`previous` to releases/`to` (agent/base/releases_record.py)."""
    (root / "standing.node.previous").write_text(json.dumps(
        {"previous": f"{root}/releases/{previous}/igneumd", "previous_sha256": "aa" * 32,
         "to": f"{root}/releases/{to}/igneumd", "to_sha256": "bb" * 32}) + "\n")


def filled(tmp: Path) -> tuple[Path, Path, Path]:
    """A box root after months: releases old and kept, logs rotated beyond the window,
    caches, an old pack export, a finished snapshot, an unread output, a model."""
    root, home, apt = tmp / "fleet", tmp / "home", tmp / "apt"
    for d in ("aaaa", "bbbb", "cccc", "dddd", "eeee"):
        put(root / "releases" / d / "igneumd", 64 << 10)
    (root / "standing.node").write_text(f"{root}/releases/aaaa/igneumd\n")
    record(root, "bbbb", "aaaa")
    (root / "agent.toml").write_text(f'command = ["{root}/releases/cccc/igneum-miner"]\n')
    put(root / "log" / "agent.log")
    put(root / "log" / "agent.log.1")
    put(root / "log" / "agent.log.9", 32 << 10)
    put(root / "out" / "standing.log")
    put(home / ".cache" / "pip" / "wheels" / "x.whl", 16 << 10)
    put(home / ".cache" / "huggingface" / "hub" / "blob", 16 << 10)
    put(root / "cache" / "hub" / "blobs" / "toolchain", 16 << 10)
    (root / "jobs" / "bench").mkdir(parents=True)
    (root / "jobs" / "bench" / "state.json").write_text('{"phase": "finished"}')
    put(apt / "tool.deb", 8 << 10)
    put(root / "pack" / "pack.json")
    put(root / "pack.old" / "pack.json", 8 << 10)
    put(root / "snapshots" / "exec-1.tar", 8 << 10)
    put(root / "jobs" / "bench" / "outputs" / "result.bin", 8 << 10)
    put(root / "models" / "weights.bin", 8 << 10)
    put(root / "venv" / "bin" / "python")
    return root, home, apt


def listing(*tops: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (st.st_size, st.st_mtime_ns) for top in tops for p, st in space.walk(top)}


def forged(root: Path, *paths: Path | str, name: str = "old releases") -> dict[str, Any]:
    """A hand-edited review naming `paths` as regenerable, each with the size and mtime its
    target has now (so the unchanged-check passes)."""
    entries = []
    for p in paths:
        st = os.stat(p)  # follows: what lstat on the spelled path resolves to
        entries.append([str(p), st.st_size, st.st_mtime_ns, st.st_blocks * 512])
    return {"root": str(root), "categories": [
        {"name": name, "regenerable": True, "bytes": 1, "paths": entries}]}


def rules(root: Path, home: Path, apt: Path) -> space.Rules:
    return space.Rules.of(root, log_keep=5, home=home, apt=apt)


def by_name(review: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in review["categories"]}


def test_the_review_lists_each_category_and_changes_nothing(tmp_path: Path) -> None:
    root, home, apt = filled(tmp_path)
    before = listing(root, home, apt)
    r = space.review(rules(root, home, apt))
    assert listing(root, home, apt) == before
    cats = by_name(r)
    old = {Path(p[0]).parent.name for p in cats["old releases"]["paths"]}
    assert old == {"dddd", "eeee"}  # running aaaa, previous bbbb, wanted cccc are kept
    assert cats["releases"]["regenerable"] is False and cats["releases"]["files"] == 3
    assert [Path(p[0]).name for p in cats["rotated logs"]["paths"]] == ["agent.log.9"]
    assert cats["logs"]["files"] == 3  # agent.log, agent.log.1 and standing.log
    for name in ("pip cache", "apt cache", "old pack exports", "recovery snapshots"):
        assert cats[name]["regenerable"] and cats[name]["files"] == 1, name
    assert cats["huggingface cache"]["files"] == 2  # ~/.cache/huggingface and the agent's
    for name in ("job outputs", "pack", "models", "fleet files"):
        assert not cats[name]["regenerable"] and cats[name]["paths"] == [], name
    assert r["freeable_bytes"] == sum(c["bytes"] for c in r["categories"] if c["regenerable"])
    assert r["free_after_bytes"] == r["disk"]["free_bytes"] + r["freeable_bytes"]
    assert all(c["oldest"] for c in r["categories"])


def test_the_clean_frees_what_the_review_promised_and_keeps_the_rest(tmp_path: Path) -> None:
    root, home, apt = filled(tmp_path)
    r = space.review(rules(root, home, apt))
    done = space.clean(rules(root, home, apt), r)
    assert done["skipped"] == [] and done["refused"] == []
    for name, tally in done["categories"].items():
        assert tally["freed"] == tally["promised"], name
    left = listing(root, home, apt)
    assert not any("/releases/dddd" in p or "/releases/eeee" in p for p in left)
    assert not (root / "releases" / "dddd").exists()  # its emptied directory too
    for kept in ("releases/aaaa/igneumd", "releases/bbbb/igneumd", "releases/cccc/igneumd",
                 "log/agent.log", "log/agent.log.1", "jobs/bench/outputs/result.bin",
                 "pack/pack.json", "models/weights.bin", "venv/bin/python"):
        assert (root / kept).exists(), kept
    assert (home / ".cache" / "pip").is_dir()  # the cache's own top stays
    assert space.review(rules(root, home, apt))["freeable_bytes"] == 0


def test_a_file_changed_since_the_review_is_skipped_and_named(tmp_path: Path) -> None:
    root, home, apt = filled(tmp_path)
    r = space.review(rules(root, home, apt))
    changed = put(root / "releases" / "dddd" / "igneumd", 1234)
    done = space.clean(rules(root, home, apt), r)
    assert done["skipped"] == [{"path": str(changed), "why": "changed since the review"}]
    assert changed.exists() and not (root / "releases" / "eeee").exists()


def test_a_hand_edited_review_naming_a_kept_file_is_refused_for_that_file(
        tmp_path: Path) -> None:
    root, home, apt = filled(tmp_path)
    r = space.review(rules(root, home, apt))
    forged = []
    for rel in ("releases/aaaa/igneumd", "releases/bbbb/igneumd",
                "jobs/bench/outputs/result.bin", "log/agent.log"):
        st = (root / rel).lstat()
        forged.append([str(root / rel), st.st_size, st.st_mtime_ns, 0])
    outside = put(tmp_path / "etc" / "passwd")
    st = outside.lstat()
    forged.append([str(outside), st.st_size, st.st_mtime_ns, 0])
    r["categories"].append({"name": "old releases", "regenerable": True, "bytes": 0,
                            "paths": forged})
    done = space.clean(rules(root, home, apt), r)
    assert [x["path"] for x in done["refused"]] == [p[0] for p in forged]
    assert all(Path(p[0]).exists() for p in forged)
    assert "preserved (releases: the running, previous and wanted releases)" in \
        done["refused"][0]["why"]
    assert done["refused"][-1]["why"] == "preserved (not the fleet's)"


def test_snapshots_are_kept_while_a_recovery_runs_or_its_state_cannot_be_read(
        tmp_path: Path) -> None:
    root, home, apt = filled(tmp_path)
    (root / "run").mkdir()
    (root / "run" / "state.json").write_text(json.dumps({"recovery": {"state": "running"}}))
    assert "recovery snapshots" not in by_name(space.review(rules(root, home, apt)))
    (root / "run" / "state.json").write_text("{not json")
    cats = by_name(space.review(rules(root, home, apt)))
    assert cats["snapshots in use"]["files"] == 1 and "recovery snapshots" not in cats


def cli(root: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    (root / "agent.toml").write_text(f'root = "{root}"\n')
    return subprocess.run([sys.executable, "-m", "agent", "storage", "--config",
                           str(root / "agent.toml"), *args], cwd=REPO, input=stdin,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,stdin,said", [
    (["clean"], None, "storage clean needs --from REVIEW.json"),
    (["clean", "--from", "-"], "{not json", "is not JSON"),
    (["clean", "--from", "-"], '{"root": "/elsewhere", "categories": []}',
     "is not a storage review of"),
    (["clean", "--from", "-"], '{"root": "ROOT", "categories": [{"paths": [["x", "1", 2]]}]}',
     "a path that is not [path, size, mtime_ns, ...]"),
    (["--dry-run"], None, "--from, --dry-run and --keep are for `storage clean`"),
    (["clean", "--from", "-", "--keep", "../etc"], "{}", "--keep '../etc' is not a release"),
])
def test_a_bad_clean_is_one_line_and_status_2_and_deletes_nothing(
        tmp_path: Path, args: list[str], stdin: str | None, said: str) -> None:
    root = tmp_path / "fleet"
    put(root / "releases" / "old" / "igneumd")
    before = listing(root)
    r = cli(root, *args, stdin=None if stdin is None else stdin.replace("ROOT", str(root)))
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert listing(root) == {k: v for k, v in before.items()} | \
        {str(root / "agent.toml"): listing(root)[str(root / "agent.toml")]}


def test_the_cli_reviews_then_cleans_from_the_saved_review(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    put(root / "releases" / "old" / "igneumd", 32 << 10)
    put(root / "releases" / "new" / "igneumd")
    (root / "standing.node").write_text(f"{root}/releases/new/igneumd\n")
    record(root, "new", "new")
    reviewed = cli(root)
    assert reviewed.returncode == 0, reviewed.stderr
    saved = tmp_path / "review.json"
    saved.write_text(reviewed.stdout)
    dry = json.loads(cli(root, "clean", "--from", str(saved), "--dry-run").stdout)
    assert dry["dry_run"] and (root / "releases" / "old" / "igneumd").exists()
    done = json.loads(cli(root, "clean", "--from", str(saved)).stdout)
    assert done["categories"]["old releases"]["freed"] == \
        done["categories"]["old releases"]["promised"] > 0
    assert not (root / "releases" / "old").exists() and (root / "releases" / "new").exists()


def test_the_toolchain_cache_is_kept_while_a_job_runs_or_its_state_cannot_be_read(
        tmp_path: Path) -> None:
    root, home, apt = filled(tmp_path)
    (root / "jobs" / "bench" / "state.json").write_text('{"phase": "running"}')
    cats = by_name(space.review(rules(root, home, apt)))
    assert cats["toolchain cache in use"]["files"] == 1 and cats["huggingface cache"]["files"] == 1
    (root / "jobs" / "bench" / "state.json").write_text("{torn")
    assert "toolchain cache in use" in by_name(space.review(rules(root, home, apt)))


def test_no_clean_runs_while_a_switch_holds_its_lock(tmp_path: Path) -> None:
    """A switch holds run/switch.lock for its whole life: a clean waits, then refuses."""
    import fcntl

    root = tmp_path / "fleet"
    put(root / "releases" / "old" / "igneumd", 32 << 10)
    put(root / "releases" / "new" / "igneumd")
    (root / "standing.node").write_text(f"{root}/releases/new/igneumd\n")
    record(root, "new", "new")
    saved = tmp_path / "review.json"
    saved.write_text(cli(root).stdout)
    (root / "run").mkdir()
    with open(root / "run" / "switch.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = cli(root, "clean", "--from", str(saved), "--lock-wait-s", "0.5")
    assert r.returncode == 1 and "a switch has held" in r.stderr and "nothing deleted" in r.stderr
    assert (root / "releases" / "old" / "igneumd").exists()
    assert cli(root, "clean", "--from", str(saved)).returncode == 0  # once it ended
    assert not (root / "releases" / "old").exists()
