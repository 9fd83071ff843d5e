"""Which releases the clean keeps, by where each named path leads (agent/space.py): the
pointer, the previous-release record, the node binary the agent recorded and agent.toml name
paths, and each is resolved through every link to the release folder it lies in; a path that
cannot be told keeps every release. Never a match on the text."""

from __future__ import annotations

import json
import os
from pathlib import Path

from test_agent_storage import put
from test_agent_storage_failclosed import box, old_releases, rules

from agent import space


def point(root: Path, pointer: str, previous: str) -> None:
    """The pointer and the record of the switch that wrote it (from `previous`)."""
    (root / "standing.node").write_text(pointer + "\n")
    (root / "standing.node.previous").write_text(json.dumps(
        {"previous": previous, "previous_sha256": "aa" * 32, "to": pointer,
         "to_sha256": "bb" * 32}) + "\n")


def clean_by_review(root: Path, home: Path, apt: Path) -> dict[str, object]:
    return space.clean(rules(root, home, apt), space.review(rules(root, home, apt)))


def test_a_pointer_through_a_linked_release_folder_keeps_where_it_leads_and_the_link(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    os.symlink("aaaa", root / "releases" / "cur")
    point(root, f"{root}/releases/cur/igneumd", f"{root}/releases/bbbb/igneumd")
    assert old_releases(space.review(rules(root, home, apt))) == ["cccc"]
    clean_by_review(root, home, apt)
    assert (root / "releases" / "aaaa" / "igneumd").exists()
    assert (root / "releases" / "cur").is_symlink()
    assert not (root / "releases" / "cccc").exists()


def test_a_pointer_outside_the_releases_linking_into_one_keeps_that_release(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    (root / "bin").mkdir()
    os.symlink(root / "releases" / "aaaa" / "igneumd", root / "bin" / "igneumd")
    point(root, f"{root}/bin/igneumd", f"{root}/releases/bbbb/igneumd")
    clean_by_review(root, home, apt)
    assert (root / "releases" / "aaaa" / "igneumd").exists()
    assert old_releases(space.review(rules(root, home, apt))) == []


def test_a_pointer_with_a_doubled_slash_keeps_its_release(tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    point(root, f"{root}/releases//aaaa/igneumd", f"{root}/releases/bbbb/igneumd")
    clean_by_review(root, home, apt)
    assert (root / "releases" / "aaaa" / "igneumd").exists()


def test_release_folders_named_with_a_space_or_a_quote_are_kept_when_named(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "ab cd", "it's", "cccc")
    point(root, f"{root}/releases/ab cd/igneumd", f"{root}/releases/it's/igneumd")
    clean_by_review(root, home, apt)
    assert (root / "releases" / "ab cd" / "igneumd").exists()
    assert (root / "releases" / "it's" / "igneumd").exists()
    assert not (root / "releases" / "cccc").exists()


def test_a_named_path_that_leads_to_no_single_release_keeps_every_release(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc")
    for pointer in (f"{root}/bin/gone", f"{root}/releases", f"{root}/releases/"):
        point(root, pointer, f"{root}/releases/bbbb/igneumd")
        assert space.kept_releases(root) is None, pointer
    point(root, f"{root}/releases/aaaa/igneumd", f"{root}/bin")  # a folder, not a binary
    assert space.kept_releases(root) is None


def test_the_node_binary_the_agent_recorded_is_resolved_through_its_links(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc", "dddd")
    point(root, f"{root}/releases/aaaa/igneumd", f"{root}/releases/bbbb/igneumd")
    os.symlink("cccc", root / "releases" / "running")
    (root / "run").mkdir()
    (root / "run" / "state.json").write_text(json.dumps(
        {"node_binary": {"path": f"{root}/releases/running/igneumd", "sha256": "cc" * 32}}))
    assert space.kept_releases(root) == {"aaaa", "bbbb", "cccc", "running"}


def test_agent_toml_s_paths_are_resolved_and_a_release_it_cannot_name_keeps_all(
        tmp_path: Path) -> None:
    root, home, apt = box(tmp_path, "aaaa", "bbbb", "cccc", "dddd")
    point(root, f"{root}/releases/aaaa/igneumd", f"{root}/releases/bbbb/igneumd")
    put(root / "bin" / "placeholder")
    os.symlink(root / "releases" / "cccc" / "igneumd", root / "bin" / "miner")
    (root / "agent.toml").write_text(
        f'root = "{root}"\n[programs.miner]\ncommand = ["{root}/bin/miner", '
        '"--data={root}/releases/dddd/data"]\n')
    assert space.kept_releases(root) == {"aaaa", "bbbb", "cccc", "dddd"}
    (root / "agent.toml").write_text(
        '[programs.miner]\ncommand = "{root}/releases/{name}/miner"\n')
    assert space.kept_releases(root) is None
