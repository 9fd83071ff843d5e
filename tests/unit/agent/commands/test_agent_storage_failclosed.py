"""The storage clean fails closed (agent/space.py): whatever of the rules cannot be read keeps
every file for the whole clean; the previous release is the recorded one, never a guess; a
release staged for a publish is kept; a rule file on a FIFO blocks nothing; nothing is deleted
across a mount; only inodes actually freed count as freed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from repo_root import ROOT as REPO
from test_agent_storage import forged, put

from agent import space


def record(root: Path, previous: str, to: str) -> None:
    """The previous-release record a switch from `previous` to `to` leaves."""
    (root / "standing.node.previous").write_text(json.dumps(
        {"previous": f"{root}/releases/{previous}/igneumd", "previous_sha256": "aa" * 32,
         "to": f"{root}/releases/{to}/igneumd", "to_sha256": "bb" * 32}) + "\n")


def box(tmp: Path, *releases: str) -> tuple[Path, Path, Path]:
    root, home, apt = tmp / "fleet", tmp / "home", tmp / "apt"
    for d in releases:
        put(root / "releases" / d / "igneumd", 16 << 10)
    (root / "standing.node").write_text(f"{root}/releases/{releases[0]}/igneumd\n")
    (root / "agent.toml").write_text(f'root = "{root}"\n')
    put(home / ".cache" / "pip" / "wheels" / "x.whl")
    apt.mkdir(parents=True)
    return root, home, apt


def rules(root: Path, home: Path, apt: Path) -> space.Rules:
    return space.Rules.of(root, log_keep=5, home=home, apt=apt)


def old_releases(review: dict[str, Any]) -> list[str]:
    return sorted({Path(p[0]).parent.name for c in review["categories"]
                   if c["name"] == "old releases" for p in c["paths"]})


# a clean in a process whose file descriptors are all taken: nothing of the rules can be read
EXHAUSTED = """
import json, os, resource, sys
from pathlib import Path
from agent import space
root, home, apt, review = sys.argv[1:5]
reviewed = json.loads(Path(review).read_text())
held = []
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
done = space.clean(space.Rules.of(Path(root), 5, home=Path(home), apt=Path(apt)), reviewed)
for fd in held:
    os.close(fd)
print(json.dumps(done))
"""


def test_rules_that_cannot_be_read_keep_every_file_for_the_whole_clean(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    record(root, "bbbb", "aaaa")
    running, pip = root / "releases" / "aaaa" / "igneumd", home / ".cache/pip/wheels/x.whl"
    saved = tmp_path / "review.json"
    saved.write_text(json.dumps(forged(root, running, pip)))
    r = subprocess.run([sys.executable, "-c", EXHAUSTED, str(root), str(home), str(apt),
                        str(saved)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert running.exists() and pip.exists()
    assert sorted(x["path"] for x in done["refused"]) == sorted([str(running), str(pip)])
    assert all("cannot be read" in x["why"] for x in done["refused"]), done["refused"]


def test_with_no_previous_recorded_every_release_is_kept_whatever_the_mtimes(
        tmp_path: Path) -> None:
    """A box switched before the record keeps every release until its next switch: no guess
    by mtime, which the clean's own deletions would move onto another release."""
    root, home, apt = box(tmp_path, "aaaa", "prev", "xold")
    put(root / "releases" / "xold" / "igneum-miner")
    os.utime(root / "releases" / "xold", (1, 1))  # prev looks like the previous one
    for _ in range(2):
        reviewed = space.review(rules(root, home, apt))
        space.clean(rules(root, home, apt), reviewed)
        os.utime(root / "releases" / "prev", (1, 1))  # whatever the mtimes say next
    assert (root / "releases" / "prev" / "igneumd").exists()
    assert (root / "releases" / "xold" / "igneumd").exists()
    assert old_releases(space.review(rules(root, home, apt))) == []


def test_a_record_that_does_not_name_the_pointer_it_led_to_keeps_every_release(
        tmp_path: Path) -> None:
    """A pointer written since the record (not by a switch: cccc -> aaaa) leaves the record
    stale; one that does not say where it led (an older record) cannot be checked."""
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    (root / "standing.node.previous").write_text(f"{root}/releases/bbbb/igneumd\nff\n")
    assert old_releases(space.review(rules(root, home, apt))) == []
    record(root, "bbbb", "cccc")
    assert old_releases(space.review(rules(root, home, apt))) == []
    record(root, "bbbb", "aaaa")
    assert old_releases(space.review(rules(root, home, apt))) == ["cccc"]


def test_a_staged_release_and_its_unpack_are_kept_while_its_record_is_there(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "new1", "gone")
    record(root, "bbbb", "aaaa")
    staged = root / "releases.staged"
    staged.mkdir()
    (staged / "new1").write_text("")
    put(root / "releases" / "new1.partial" / "igneum-miner")  # its unpack, not yet in place
    assert old_releases(space.review(rules(root, home, apt))) == ["gone"]


def test_a_rule_file_on_a_fifo_hangs_neither_the_review_nor_the_clean(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    os.mkfifo(root / "standing.node.previous")
    config = ["--config", str(root / "agent.toml")]
    r = subprocess.run([sys.executable, "-m", "agent", "storage", *config], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert old_releases(json.loads(r.stdout)) == []
    old = root / "releases" / "cccc" / "igneumd"
    r = subprocess.run([sys.executable, "-m", "agent", "storage", "clean", "--from", "-",
                        *config], cwd=REPO, input=json.dumps(forged(root, old)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert old.exists() and [x["path"] for x in json.loads(r.stdout)["refused"]] == [str(old)]


def test_nothing_is_deleted_across_a_mount(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    record(root, "bbbb", "aaaa")
    mnt = root / "releases" / "cccc" / "data"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        inside = put(mnt / "chain.db", 1024)
        done = space.clean(rules(root, home, apt), forged(root, inside))
        assert inside.exists()
        assert [x["path"] for x in done["refused"]] == [str(inside)]
        assert "mount" in done["refused"][0]["why"]
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_hard_link_to_a_kept_file_is_not_counted_as_freed(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    record(root, "bbbb", "aaaa")
    os.link(root / "releases" / "aaaa" / "igneumd", root / "releases" / "cccc" / "shared")
    reviewed = space.review(rules(root, home, apt))
    old = {c["name"]: c for c in reviewed["categories"]}["old releases"]
    alone = (root / "releases" / "cccc" / "igneumd").stat().st_blocks * 512
    assert old["files"] == 2 and old["bytes"] == alone
    done = space.clean(rules(root, home, apt), reviewed)
    assert done["categories"]["old releases"]["freed"] == alone
    assert (root / "releases" / "aaaa" / "igneumd").exists()


def test_two_links_both_regenerable_count_once_when_both_go(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    record(root, "bbbb", "aaaa")
    os.link(root / "releases" / "cccc" / "igneumd", root / "releases" / "cccc" / "again")
    reviewed = space.review(rules(root, home, apt))
    old = {c["name"]: c for c in reviewed["categories"]}["old releases"]
    size = (root / "releases" / "cccc" / "igneumd").stat().st_blocks * 512
    assert old["files"] == 2 and old["bytes"] == size
    done = space.clean(rules(root, home, apt), reviewed)
    assert done["categories"]["old releases"]["freed"] == size


def test_a_switch_records_each_pointer_move_and_the_clean_keeps_what_it_moved_from(
        tmp_path: Path) -> None:
    """`agent switch` to a release that never comes up (no agent here) reverts: each pointer
    move is recorded, so the clean keeps the release it moved from and the one it tried."""
    import hashlib

    from agent.base.config import load_config
    from agent.commands.switch import switch, write_pointer

    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    cfg = load_config(root / "agent.toml")
    binary = root / "releases" / "bbbb" / "igneumd"
    binary.chmod(0o755)
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    write_pointer(cfg.layout, f"{root}/releases/aaaa/igneumd", "cd" * 32)
    done, _ = switch(cfg, str(binary), digest, stable_s=0.1, deadline_s=0.3)
    assert done["outcome"] == "failed" and (root / "standing.node").read_text().strip() == \
        f"{root}/releases/aaaa/igneumd"
    assert old_releases(space.review(rules(root, home, apt))) == ["cccc"]


def test_the_release_the_operator_wants_is_kept_by_the_clean(tmp_path: Path) -> None:
    """The fleet passes the registry's wanted release (`--keep SHA16`): a publish may not
    have staged it on this box yet, or its staging record may be gone."""
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    record(root, "bbbb", "aaaa")
    wanted = root / "releases" / "cccc" / "igneumd"
    r = subprocess.run([sys.executable, "-m", "agent", "storage", "clean", "--from", "-",
                        "--keep", "cccc", "--config", str(root / "agent.toml")], cwd=REPO,
                       input=json.dumps(forged(root, wanted)), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert wanted.exists() and [x["path"] for x in json.loads(r.stdout)["refused"]] == \
        [str(wanted)]


def test_a_fifo_at_agent_toml_hangs_neither_the_review_nor_the_clean(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb")
    (root / "agent.toml").unlink()
    os.mkfifo(root / "agent.toml")
    config = ["--config", str(root / "agent.toml")]
    for args, stdin in ((["storage"], None), (["storage", "clean", "--from", "-"], "{}")):
        r = subprocess.run([sys.executable, "-m", "agent", *args, *config], cwd=REPO,
                           input=stdin, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().count("\n") == 0 and "agent.toml" in r.stderr
