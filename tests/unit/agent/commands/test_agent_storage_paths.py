"""The box's storage clean (agent/space.py, agent/commands/storage.py) deletes nothing its
rules keep, whatever a hand-edited review says: path tricks, symlinks, odd pointers and wrong
JSON types."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from repo_root import ROOT as REPO
from test_agent_storage import forged, put, record

from agent import space


def box(tmp: Path) -> tuple[Path, Path, Path]:
    root, home, apt = tmp / "fleet", tmp / "home", tmp / "apt"
    for d in ("aaaa", "bbbb", "dddd"):
        put(root / "releases" / d / "igneumd", 16 << 10)
    (root / "standing.node").write_text(f"{root}/releases/aaaa/igneumd\n")
    record(root, "bbbb", "aaaa")
    (root / "agent.toml").write_text(f'root = "{root}"\n')
    put(root / "jobs" / "bench" / "outputs" / "result.bin")
    (root / "jobs" / "bench" / "state.json").write_text('{"phase": "finished"}')
    put(root / "cache" / "hub" / "blob")
    put(root / "snapshots" / "exec-1.tar")
    put(root / "pack.old" / "pack.json")
    put(home / ".cache" / "pip" / "wheels" / "x.whl")
    put(home / ".cache" / "huggingface" / "hub" / "blob")
    put(apt / "tool.deb")
    return root, home, apt


def rules(root: Path, home: Path, apt: Path) -> space.Rules:
    return space.Rules.of(root, log_keep=5, home=home, apt=apt)


# ---------------------------------------------------------------- `..` components


def test_dotdot_through_an_old_release_cannot_delete_the_running_binary(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path)
    running = root / "releases" / "aaaa" / "igneumd"
    trick = f"{root}/releases/dddd/../aaaa/igneumd"
    space.clean(rules(root, home, apt), forged(root, trick))
    assert running.exists(), "the running release's binary was deleted via releases/dddd/.."


def test_dotdot_through_an_old_release_cannot_delete_the_pointer(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path)
    trick = f"{root}/releases/dddd/../../standing.node"
    space.clean(rules(root, home, apt), forged(root, trick))
    assert (root / "standing.node").exists(), "standing.node deleted via releases/dddd/../.."


def test_dotdot_through_the_toolchain_cache_cannot_delete_an_unread_output(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path)
    trick = f"{root}/cache/../jobs/bench/outputs/result.bin"
    space.clean(rules(root, home, apt), forged(root, trick, name="huggingface cache"))
    assert (root / "jobs" / "bench" / "outputs" / "result.bin").exists(), \
        "an unread job output was deleted via cache/.."


def test_dotdot_through_the_pip_cache_cannot_delete_outside_what_the_fleet_wrote(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path)
    key = put(home / ".ssh" / "authorized_keys", 100)
    trick = f"{home}/.cache/pip/../../.ssh/authorized_keys"
    space.clean(rules(root, home, apt), forged(root, trick, name="pip cache"))
    assert key.exists(), "~/.ssh/authorized_keys deleted via ~/.cache/pip/../.."


def test_dotdot_escapes_the_root_entirely(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path)
    outside = put(tmp_path / "not-ours.txt", 10)
    trick = f"{root}/releases/dddd/../../../not-ours.txt"
    space.clean(rules(root, home, apt), forged(root, trick))
    assert outside.exists(), "a file outside the root was deleted via releases/dddd/../../.."


def test_dotdot_via_the_cli_with_a_saved_review(tmp_path: Path) -> None:
    """The same trick end to end: `python -m agent storage clean --from -`."""
    root, home, _ = box(tmp_path)
    trick = f"{root}/releases/dddd/../aaaa/igneumd"
    r = subprocess.run([sys.executable, "-m", "agent", "storage", "--config",
                        str(root / "agent.toml"), "clean", "--from", "-"], cwd=REPO,
                       input=json.dumps(forged(root, trick)), capture_output=True, text=True,
                       timeout=60, env={**os.environ, "HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert (root / "releases" / "aaaa" / "igneumd").exists()
    assert json.loads(r.stdout)["refused"], "the trick path was not refused"


# ---------------------------------------------------------------- symlinks


def test_a_symlinked_old_release_dir_cannot_reach_the_running_release(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path)
    (root / "releases" / "zzzz").symlink_to(root / "releases" / "aaaa")
    running = root / "releases" / "aaaa" / "igneumd"
    space.clean(rules(root, home, apt), forged(root, root / "releases" / "zzzz" / "igneumd"))
    assert running.exists(), "the running binary was deleted through a symlinked release dir"


def test_a_symlinked_cache_dir_cannot_reach_an_unread_output(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path)
    (root / "cache" / "jobs-link").symlink_to(root / "jobs")
    out = root / "jobs" / "bench" / "outputs" / "result.bin"
    space.clean(rules(root, home, apt),
                forged(root, root / "cache" / "jobs-link" / "bench" / "outputs" / "result.bin",
                       name="huggingface cache"))
    assert out.exists(), "an unread output was deleted through a symlink inside cache/"


def test_a_symlinked_hf_cache_top_is_not_deleted_by_a_review_and_clean(tmp_path: Path) -> None:
    """~/.cache/huggingface is often a symlink to a bigger disk (set up by whoever made the
    box, not the fleet): the review lists the link itself as a regenerable file, and the
    clean deletes the operator's link."""
    root, home, apt = box(tmp_path)
    hf = home / ".cache" / "huggingface"
    big = tmp_path / "bigdisk" / "hf"
    big.parent.mkdir()
    hf.rename(big)
    hf.symlink_to(big)
    r = rules(root, home, apt)
    space.clean(r, space.review(r))
    assert hf.is_symlink(), "the cache's own top (a symlink the fleet did not write) was deleted"


def test_a_symlink_inside_an_old_release_is_removed_not_its_target(tmp_path: Path) -> None:
    """Holds: unlink removes the link, the kept target stays."""
    root, home, apt = box(tmp_path)
    link = root / "releases" / "dddd" / "ptr"
    link.symlink_to(root / "releases" / "aaaa" / "igneumd")
    r = rules(root, home, apt)
    space.clean(r, space.review(r))
    assert (root / "releases" / "aaaa" / "igneumd").exists() and not link.is_symlink()


def test_a_hard_link_to_the_running_binary_in_an_old_release(tmp_path: Path) -> None:
    """Holds: deleting a hard link in an old release leaves the running binary."""
    root, home, apt = box(tmp_path)
    os.link(root / "releases" / "aaaa" / "igneumd", root / "releases" / "dddd" / "hard")
    r = rules(root, home, apt)
    space.clean(r, space.review(r))
    assert (root / "releases" / "aaaa" / "igneumd").exists()


# ---------------------------------------------------------------- odd names and pointers


def test_a_release_named_by_a_prefix_keeps_both(tmp_path: Path) -> None:
    """Holds (errs on keeping): releases/ab is kept when the pointer names releases/abc."""
    root, home, apt = box(tmp_path)
    put(root / "releases" / "abc" / "igneumd")
    put(root / "releases" / "ab" / "igneumd")
    (root / "standing.node").write_text(f"{root}/releases/abc/igneumd\n")
    record(root, "bbbb", "abc")
    kept = space.kept_releases(root)
    assert kept is not None and {"abc", "bbbb"} <= kept


def test_relative_trailing_slash_and_directory_paths_are_not_deleted(tmp_path: Path) -> None:
    """Holds: relative paths are not the fleet's; a directory is skipped."""
    root, home, apt = box(tmp_path)
    rev = {"root": str(root), "categories": [{"name": "old releases", "regenerable": True,
                                               "bytes": 1, "paths": [
        ["releases/dddd/igneumd", 16384, 0, 0],
        [f"{root}/releases/dddd/", 0, 0, 0],
        [f"{root}/releases/aaaa/igneumd/", 0, 0, 0],
    ]}]}
    done = space.clean(rules(root, home, apt), rev)
    assert (root / "releases" / "dddd" / "igneumd").exists()
    assert (root / "releases" / "aaaa" / "igneumd").exists()
    assert len(done["refused"]) + len(done["skipped"]) == 3


def write_state(root: Path, binary: Path) -> None:
    (root / "run").mkdir(parents=True, exist_ok=True)
    (root / "run" / "state.json").write_text(json.dumps(
        {"node_binary": {"path": str(binary), "sha256": "ab" * 32, "source": "pointer"}}))


def test_an_empty_pointer_keeps_the_release_the_node_still_runs(tmp_path: Path) -> None:
    """An empty standing.node is refused by the agent and "the node keeps running" (the binary
    in run/state.json): the rules cannot tell the running release from the pointer, so they
    must keep (fail closed). They keep only the previous one."""
    root, home, apt = box(tmp_path)
    write_state(root, root / "releases" / "aaaa" / "igneumd")
    (root / "standing.node").write_text("")
    assert space.kept_releases(root) is None, \
        "with an empty pointer the running release (run/state.json) is deletable"


def test_a_missing_pointer_keeps_the_adopted_running_release(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path)
    write_state(root, root / "releases" / "aaaa" / "igneumd")
    (root / "standing.node").unlink()
    assert space.kept_releases(root) is None, \
        "with no pointer the running (adopted) release is deletable"


def test_an_unreadable_pointer_keeps_every_release(tmp_path: Path) -> None:
    """Holds: a pointer that is a directory (unreadable) keeps them all."""
    root, home, apt = box(tmp_path)
    (root / "standing.node").unlink()
    (root / "standing.node").mkdir()
    assert space.kept_releases(root) is None


# ---------------------------------------------------------------- wrong types mid-clean


def run_clean(root: Path, home: Path, review: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", "storage", "--config",
                           str(root / "agent.toml"), "clean", "--from", "-"], cwd=REPO,
                          input=json.dumps(review), capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(home)})


def test_a_bad_bytes_field_after_a_good_category_is_refused_before_anything_goes(
        tmp_path: Path) -> None:
    root, home, _ = box(tmp_path)
    good = root / "releases" / "dddd" / "igneumd"
    rev = forged(root, good)
    rev["categories"].append({"name": "rotated logs", "regenerable": True, "bytes": "lots",
                              "paths": []})
    r = run_clean(root, home, rev)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-400:]
    assert good.exists(), "half done: the first category was deleted, then the clean crashed"


def test_a_nul_in_a_later_path_is_refused_before_anything_goes(tmp_path: Path) -> None:
    root, home, _ = box(tmp_path)
    good = root / "releases" / "dddd" / "igneumd"
    rev = forged(root, good)
    rev["categories"][0]["paths"].append([f"{root}/releases/dddd/x\u0000y", 1, 1])
    r = run_clean(root, home, rev)
    assert "Traceback" not in r.stderr, r.stderr[-400:]
    assert r.returncode in (0, 2)
    if r.returncode == 2:
        assert good.exists(), "half done before the crash"


def test_a_category_name_of_the_wrong_type_is_not_a_crash(tmp_path: Path) -> None:
    root, home, _ = box(tmp_path)
    rev = forged(root, root / "releases" / "dddd" / "igneumd")
    rev["categories"][0]["name"] = ["x"]
    r = run_clean(root, home, rev)
    assert "Traceback" not in r.stderr, r.stderr[-400:]


# ---------------------------------------------------------------- races and others' files


def test_a_switch_landing_mid_clean_keeps_its_release(tmp_path: Path) -> None:
    """A switch (a rollback publish to a release the review called old) that lands between
    two files (`agent switch` holds the switch lock, so not within one: that is
    tests/unit/agent/commands/test_agent_storage.py's lock test) keeps the release it moved to."""
    from test_agent_storage_midclean import Looking

    root, home, apt = box(tmp_path)
    put(root / "releases" / "eeee" / "igneumd")
    rev = space.review(rules(root, home, apt))
    target: list[str] = []

    def switch() -> None:  # to the old release the clean has not reached yet
        other = "eeee" if (root / "releases" / "eeee").exists() and not \
            (root / "releases" / "dddd" / "igneumd").exists() else "dddd"
        target.append(other)
        record(root, "aaaa", other)
        (root / "standing.node").write_text(f"{root}/releases/{other}/igneumd\n")

    space.clean(Looking(rules(root, home, apt), 2, switch), rev)
    assert (root / "releases" / target[0] / "igneumd").exists(), \
        "the release a switch moved to during the clean was deleted"


def test_apt_s_lock_file_is_not_deleted(tmp_path: Path) -> None:
    """/var/cache/apt/archives/lock is apt's lock, not a package: the review lists it as
    regenerable and the clean deletes it (apt may hold it at that moment)."""
    root, home, apt = box(tmp_path)
    lock = put(apt / "lock", 0)
    r = rules(root, home, apt)
    space.clean(r, space.review(r))
    assert lock.exists(), "apt's lock file was deleted"
