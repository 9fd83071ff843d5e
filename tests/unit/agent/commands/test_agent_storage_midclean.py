"""What lands on the box while a storage clean runs (agent/space.py): a job that starts, a
publish's staging followed by other pointer writes, a mount; and what the switch does to the
staging records. Each is read again where it could have changed, never trusted from the
clean's start."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from test_agent_storage import put
from test_agent_storage_failclosed import box, old_releases, record, rules

from agent import space


class Looking:
    """The box's rules, with `event` done on the box at the clean's `at`-th look at them (a
    clean looks before each file)."""

    def __init__(self, rules: space.Rules, at: int, event: Any) -> None:
        self.rules, self.at, self.event, self.looks = rules, at, event, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rules, name)

    def now(self) -> space.Classifier:
        self.looks += 1
        if self.looks == self.at:
            self.event()
        self.rules = self.rules.now()
        return self


def test_a_job_admitted_after_the_clean_read_its_rules_keeps_its_toolchain_cache(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb")
    record(root, "bbbb", "aaaa")
    job = root / "jobs" / "j1"
    job.mkdir(parents=True)
    (job / "job.json").write_text("{}")  # uploaded, not yet admitted: nothing fetched
    blobs = [put(root / "cache" / "hub" / "models--x" / "blobs" / f"b{i}", 8192)
             for i in range(2)]
    reviewed = space.review(rules(root, home, apt))

    def admit() -> None:  # the job's state written as the agent writes it: by rename
        (job / ".state.json.tmp").write_text(json.dumps({"phase": "admitted"}))
        os.replace(job / ".state.json.tmp", job / "state.json")

    done = space.clean(Looking(rules(root, home, apt), 1, admit), reviewed)
    assert all(b.exists() for b in blobs), done
    assert sorted(x["path"] for x in done["refused"]) == sorted(str(b) for b in blobs)


def test_a_job_s_state_rewritten_in_place_mid_clean_keeps_its_toolchain_cache(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb")
    record(root, "bbbb", "aaaa")
    job = root / "jobs" / "j1"
    job.mkdir(parents=True)
    (job / "state.json").write_text(json.dumps({"phase": "finished"}) + " " * 8)
    blob = put(root / "cache" / "hub" / "blobs" / "b1", 8192)
    reviewed = space.review(rules(root, home, apt))

    def rerun() -> None:
        with open(job / "state.json", "r+") as f:
            f.write(json.dumps({"phase": "running"}))

    space.clean(Looking(rules(root, home, apt), 1, rerun), reviewed)
    assert blob.exists()


def test_a_staged_release_is_kept_whatever_pointer_writes_come_after_its_staging(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    (root / "releases.staged").mkdir()
    (root / "releases.staged" / "cccc").write_text("")
    staged_ns = (root / "releases.staged" / "cccc").stat().st_mtime_ns
    record(root, "bbbb", "aaaa")  # another publish switched meanwhile, a second later
    later = staged_ns + 10**9
    for f in ("standing.node", "standing.node.previous"):
        os.utime(root / f, ns=(later, later))
    assert old_releases(space.review(rules(root, home, apt))) == []
    (root / "releases.staged" / "cccc").unlink()  # the operator drops the staging
    assert old_releases(space.review(rules(root, home, apt))) == ["cccc"]


def test_a_switch_to_a_staged_release_removes_its_staging_record(tmp_path: Path) -> None:
    """`agent switch` to a release that never comes up (no agent here) points at it, then
    reverts: the staging record is gone, and the release is kept as the previous one."""
    from agent.base.config import load_config
    from agent.commands.switch import switch, write_pointer

    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc", "dddd")
    (root / "releases.staged").mkdir()
    for name in ("cccc", "dddd"):
        (root / "releases.staged" / name).write_text("")
    cfg = load_config(root / "agent.toml")
    binary = root / "releases" / "cccc" / "igneumd"
    binary.chmod(0o755)
    write_pointer(cfg.layout, f"{root}/releases/aaaa/igneumd", "cd" * 32)
    done, _ = switch(cfg, str(binary), hashlib.sha256(binary.read_bytes()).hexdigest(),
                     stable_s=0.1, deadline_s=0.3)
    assert done["outcome"] == "failed"
    assert sorted(os.listdir(root / "releases.staged")) == ["dddd"]
    assert old_releases(space.review(rules(root, home, apt))) == ["bbbb"]


def test_a_mount_landing_mid_clean_is_not_crossed(tmp_path: Path) -> None:
    """A copy with the same size and mtime as the reviewed file is mounted over its folder
    after the clean checked that folder: the copy is refused, never deleted."""
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "dddd")
    record(root, "bbbb", "aaaa")
    first, second = (put(root / "releases" / "dddd" / n, 4096) for n in ("a", "b"))
    precious = tmp_path / "precious"
    precious.mkdir()
    for f in (first, second):
        shutil.copy2(f, precious / f.name)
    reviewed = {"root": str(root), "categories": [
        {"name": "old releases", "regenerable": True, "bytes": 1, "paths": [
            [str(f), f.stat().st_size, f.stat().st_mtime_ns, 0] for f in (first, second)]}]}
    mounted: list[Path] = []

    def mount() -> None:
        subprocess.run(["mount", "--bind", str(precious), str(first.parent)], check=True)
        mounted.append(first.parent)

    try:
        done = space.clean(Looking(rules(root, home, apt), 2, mount), reviewed)
    finally:
        for m in mounted:
            subprocess.run(["umount", str(m)], check=True)
    assert (precious / "a").exists() and (precious / "b").exists()
    assert not first.exists() and second.exists()
    assert [x["path"] for x in done["refused"]] == [str(second)]
    assert "mount" in done["refused"][0]["why"]
