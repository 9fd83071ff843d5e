"""The operator's side of the storage review and clean (fleet/ops/storage.py,
fleet/cli/storage_cmd.py), the disk on `fleet check` and the page. The box's side (the agent's
rules) is tests/unit/agent/commands/test_agent_storage.py; real boxes are
tests/integration/test_storage_sandbox.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import page_fixture as F
import pytest
from cli_fixture import fleet

from fleet.core.errors import UsageError
from fleet.core.verdicts import Health
from fleet.ops import check
from fleet.ops import storage as storage_ops
from fleet.page import data as page_data
from fleet.page import html as page_html


def put(path: Path, size: int = 4096) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def local_rules(tmp: Path) -> storage_ops.LocalRules:
    state = tmp / "state"
    return storage_ops.LocalRules(state, state / "cache", state / "archive",
                                  state / "releases")


def test_the_local_review_keeps_the_archive_and_releases_and_offers_the_build_cache(
        tmp_path: Path) -> None:
    from agent import space

    rules = local_rules(tmp_path)
    put(rules.cache / "bundle-abc.tar", 64 << 10)
    put(rules.cache / "release-def.tar", 64 << 10)
    put(rules.archive / "bench-1" / "fma" / "outputs" / "result.bin")
    put(rules.releases / "1.4.0" / "igneumd")
    put(rules.root / "boxes.json")
    r = space.review(rules)
    cats = {c["name"]: c for c in r["categories"]}
    assert cats["build cache"]["regenerable"] and cats["build cache"]["files"] == 2
    for kept in ("archive", "release store", "fleet state"):
        assert not cats[kept]["regenerable"] and cats[kept]["files"] == 1, kept
    done = space.clean(rules, r)
    assert done["categories"]["build cache"]["freed"] == cats["build cache"]["bytes"] > 0
    assert rules.cache.is_dir() and not any(rules.cache.iterdir())  # its top stays
    assert (rules.archive / "bench-1" / "fma" / "outputs" / "result.bin").exists()
    assert (rules.releases / "1.4.0" / "igneumd").exists()


def test_a_saved_review_that_is_not_one_is_refused_with_why(tmp_path: Path) -> None:
    bad = tmp_path / "review.json"
    for text, said in (("{torn", "is not JSON"), ('{"schema": 9, "boxes": {}}',
                                                  "is not a fleet storage review")):
        bad.write_text(text)
        with pytest.raises(UsageError, match=said):
            storage_ops.load_review(bad)
    with pytest.raises(UsageError, match="No such file"):
        storage_ops.load_review(tmp_path / "absent.json")


@pytest.mark.parametrize("args,said", [
    (["storage", "clean"], "error: fleet storage clean needs --from REVIEW.json"),
    (["storage", "clean", "--from", "nope.json"], "error: review nope.json: No such file"),
    (["storage", "review", "live-nope"], "error: no live standing box live-nope"),
])
def test_bad_storage_input_is_one_line_and_status_2(tmp_path: Path, args: list[str],
                                                     said: str) -> None:
    r = fleet(tmp_path, *args)
    assert r.returncode == 2 and r.stderr.startswith(said), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_clean_by_a_review_of_another_box_under_the_label_deletes_nothing(
        tmp_path: Path) -> None:
    """A box re-rented under the label since the review is not the box the review read."""
    from fleet.core.boxes import Row

    row = Row("live-a", "vast", "live", "standing", "RTX 4090", 1, 0.3, "running",
              provider_id="222", ssh_host="h", ssh_port=22, host_key="k")
    reviewed = {"schema": 1, "boxes": {"live-a": {"provider_id": "111", "categories": []},
                                       "live-b": {"provider_id": "9", "categories": []}}}
    done = storage_ops.clean(F.config(tmp_path), reviewed, {"live-a": row}, None, False)
    assert done["boxes"] == {}
    assert done["errors"] == {"live-a": "not the live box the review read: nothing deleted",
                              "live-b": "not the live box the review read: nothing deleted"}


def test_the_check_reads_the_fullest_disk_the_agent_writes_to() -> None:
    disk = {"free_bytes": {"run": 50, "out": 10}, "total_bytes": {"run": 100, "out": 100}}
    assert check._fullest(disk) == (10, 100)
    assert check._fullest({"free_bytes": {"run": 5}}) == (None, None)  # no total: unknown
    assert check._fullest({}) == (None, None)


def test_the_page_shows_each_box_s_free_disk_and_flags_it_under_15_percent(
        tmp_path: Path) -> None:
    low = Health("x", "vast", ssh=True, agent=True, disk_free=14, disk_total=100)
    ok = Health("y", "vast", ssh=True, agent=True, disk_free=15, disk_total=100)
    assert page_data.disk_of(low)["low"] is True and page_data.disk_of(ok)["low"] is False
    assert page_data.disk_of(Health("z", "vast"))["low"] is None  # unknown, never "fine"
    health = F.health()
    health[0].disk_free, health[0].disk_total = 10 << 30, 100 << 30
    d = page_data.build(page_data.PageInputs(F.config(), F.rows(), health, F.watched(), F.NOW,
                                             owed=F.owed()))
    by = {b["label"]: b for b in d["boxes"]}
    assert by[health[0].label]["disk"] == {"free_bytes": 10 << 30, "total_bytes": 100 << 30,
                                           "free_share": 0.1, "low": True}
    page_html.write(tmp_path, d)
    text = (tmp_path / "index.html").read_text()
    assert "disk 10% free" in text and "low disk" in text
    assert json.loads((tmp_path / "fleet.json").read_text())["boxes"]


def test_a_stopped_sandbox_s_folder_is_leftovers_and_a_running_one_is_kept(
        tmp_path: Path) -> None:
    from dataclasses import replace

    from agent import space

    rules = replace(local_rules(tmp_path), sandbox=tmp_path / "sbx", sandbox_running=False)
    put(rules.sandbox / "boxes" / "vast-1" / "log" / "sshd.log")  # type: ignore[operator]
    put(rules.sandbox / "hub" / "objects" / "abc")  # type: ignore[operator]
    cats = {c["name"]: c for c in space.review(rules)["categories"]}
    assert cats["sandbox leftovers"]["regenerable"] and cats["sandbox leftovers"]["files"] == 2
    running = replace(rules, sandbox_running=True)
    cats = {c["name"]: c for c in space.review(running)["categories"]}
    assert not cats["sandbox in use"]["regenerable"] and "sandbox leftovers" not in cats
    done = space.clean(running, space.review(rules))  # reviewed stopped, running by the clean
    assert [x["path"] for x in done["refused"]] and not done["categories"][
        "sandbox leftovers"]["freed"]
    assert (rules.sandbox / "hub" / "objects" / "abc").exists()  # type: ignore[operator]


def test_the_review_never_crosses_into_a_filesystem_mounted_below(tmp_path: Path) -> None:
    """A leftover box disk (or overlay of the host's root) mounted under the folder is
    another filesystem: never read, never cleaned."""
    import subprocess

    from agent import space

    rules = local_rules(tmp_path)
    put(rules.cache / "bundle.tar")
    mnt = rules.cache / "leftover-mount"
    mnt.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        put(mnt / "inside", 1024)
        paths = [p[0] for c in space.review(rules)["categories"] for p in c["paths"]]
        assert str(rules.cache / "bundle.tar") in paths
        assert not any(p.startswith(str(mnt)) for p in paths)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_release_staged_by_a_publish_is_kept_until_a_switch_moves_on(tmp_path: Path) -> None:
    """release.present's unpack (run as the box runs it) records the staging; the box's clean
    keeps the staged release although nothing names it yet, and not after a later switch."""
    import hashlib
    import subprocess
    import tarfile

    from agent import space
    from agent.base import releases_record
    from agent.contract import Layout
    from operations.release import _UNPACK

    root = tmp_path / "fleet"
    put(root / "releases" / "aaaa" / "igneumd")
    put(root / "releases" / "bbbb" / "igneumd")
    (root / "standing.node").write_text(f"{root}/releases/aaaa/igneumd\n")
    (root / "standing.node.previous").write_text(json.dumps(
        {"previous": f"{root}/releases/bbbb/igneumd", "to": f"{root}/releases/aaaa/igneumd"}))
    binary = put(tmp_path / "igneumd")
    tarball = tmp_path / "release.tar"
    with tarfile.open(tarball, "w") as t:
        t.add(binary, "igneumd")
    sums = f"{hashlib.sha256(binary.read_bytes()).hexdigest()}  igneumd\n"
    r = subprocess.run(["sh", "-c", _UNPACK, "release", f"{root}/releases/cccc", str(tarball),
                        sums], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert space.kept_releases(root) == {"aaaa", "bbbb", "cccc"}
    later = (root / "releases.staged" / "cccc").stat().st_mtime_ns + 10**9
    os.utime(root / "standing.node", ns=(later, later))  # another pointer write: still kept
    assert space.kept_releases(root) == {"aaaa", "bbbb", "cccc"}
    for move in (("aaaa", "cccc"), ("cccc", "bbbb")):  # a switch to it, then one on
        releases_record.record(Layout(root), *({"target": f"{root}/releases/{r}/igneumd",
                                                "sha256": "ab" * 32} for r in move))
        (root / "standing.node").write_text(f"{root}/releases/{move[1]}/igneumd\n")
    assert not (root / "releases.staged" / "cccc").exists()
    assert space.kept_releases(root) == {"bbbb", "cccc"}


def test_paths_with_escape_sequences_reach_the_terminal_escaped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    crooked = put(state / "cache" / "bundle-\x1b[2J\x1b]0;owned\x07.tar")
    review = fleet(tmp_path, "storage", "review", "--archive", "--json")
    assert review.returncode == 0, review.stderr
    saved = tmp_path / "review.json"
    saved.write_text(review.stdout)
    with crooked.open("ab") as f:
        f.write(b"changed")  # skipped by the clean, which names it
    r = fleet(tmp_path, "storage", "clean", "--from", str(saved))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "bundle-\\x1b[2J\\x1b]0;owned\\x07.tar" in r.stdout


def test_the_box_s_clean_keeps_the_release_the_registry_wants_on_it() -> None:
    from fleet.core.boxes import Row

    row = Row("live-a", "vast", "live", "standing", "RTX 4090", 1, 0.3, "running",
              node_sha16_wanted="ce417bb64b68f0b8")
    assert storage_ops.keep_wanted(row) == " --keep ce417bb64b68f0b8"
    row.node_sha16_wanted = "x; rm -rf /"
    assert storage_ops.keep_wanted(row) == ""


EVIL = "old releases\x1b]0;PWNED\x07\x1b[2J"


def test_a_box_s_category_names_reach_the_terminal_escaped_at_any_width() -> None:
    import io

    from rich.console import Console

    from fleet.cli import tables
    from fleet.cli.storage_cmd import clean_table, review_table

    part = {"categories": [{"name": EVIL, "regenerable": True, "bytes": 1, "files": 1,
                            "oldest": 0, "paths": []}], "disk": {}, "freeable_bytes": 1}
    report = {"categories": {EVIL: {"promised": 1, "freed": 1, "files": 1}}}
    for width in (200, 20):  # whole, and folded
        buf = io.StringIO()
        console = Console(file=buf, force_terminal=True, width=width)
        tables.show(console, review_table(EVIL, part))
        tables.show(console, clean_table(EVIL, report))
        assert "\x1b]0;PWNED" not in buf.getvalue() and "\x1b[2J" not in buf.getvalue()
        assert "\\x1b]0;PWNED\\x07" in buf.getvalue()


def test_a_category_no_rules_know_is_refused_in_reviews_and_reports(tmp_path: Path) -> None:
    saved = tmp_path / "review.json"
    saved.write_text(json.dumps({"schema": 1, "boxes": {"live-a": {
        "provider_id": "1", "categories": [{"name": EVIL, "bytes": 0, "paths": []}]}}}))
    with pytest.raises(UsageError, match="unknown category 'old releases\\\\x1b"):
        storage_ops.load_review(saved)
    r = fleet(tmp_path, "storage", "clean", "--from", str(saved))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "\x1b" not in r.stderr
    assert storage_ops.unknown_category(
        {"categories": [{"name": "pip cache"}, {"name": EVIL}]}, storage_ops.space.CATEGORIES
    ) == "unknown category 'old releases\\x1b]0;PWNED\\x07\\x1b[2J'"
    assert storage_ops.unknown_category({"categories": {"pip cache": {}}},
                                        storage_ops.space.CATEGORIES) is None
