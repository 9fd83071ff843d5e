"""The operator's side of the storage clean (fleet/ops/storage.py) deletes nothing its rules
keep: LocalRules path tricks and overlaps, and a hand-edited review of the wrong shape,
refused before anything goes."""

from __future__ import annotations

import os
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

from agent import space
from fleet.core.boxes import Row
from fleet.core.errors import FleetError
from fleet.ops import storage as storage_ops


def put(path: Path, size: int = 4096) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def local(tmp: Path, archive: Path | None = None, releases: Path | None = None
          ) -> storage_ops.LocalRules:
    state = tmp / "state"
    return storage_ops.LocalRules(state, state / "cache", archive or state / "archive",
                                  releases or state / "releases")


def entry(p: Path | str) -> list[Any]:
    st = os.stat(p)
    return [str(p), st.st_size, st.st_mtime_ns, st.st_blocks * 512]


def forged(rules: storage_ops.LocalRules, *paths: Path | str) -> dict[str, Any]:
    return {"root": str(rules.root), "categories": [
        {"name": "build cache", "regenerable": True, "bytes": 1,
         "paths": [entry(p) for p in paths]}]}


def test_dotdot_through_the_build_cache_cannot_delete_the_registry(tmp_path: Path) -> None:
    r = local(tmp_path)
    put(r.cache / "bundle-abc.tar")
    registry = put(r.root / "boxes.json")
    space.clean(r, forged(r, f"{r.cache}/../boxes.json"))
    assert registry.exists(), "the registry was deleted via cache/.."


def test_dotdot_through_the_build_cache_cannot_delete_the_archive(tmp_path: Path) -> None:
    r = local(tmp_path)
    put(r.cache / "bundle-abc.tar")
    out = put(r.archive / "bench-1" / "outputs" / "result.bin")
    space.clean(r, forged(r, f"{r.cache}/../archive/bench-1/outputs/result.bin"))
    assert out.exists(), "an archived output was deleted via cache/.."


def test_a_symlink_in_the_build_cache_cannot_reach_the_release_store(tmp_path: Path) -> None:
    r = local(tmp_path)
    rel = put(r.releases / "1.4.0" / "igneumd")
    r.cache.mkdir(parents=True)
    (r.cache / "rel").symlink_to(r.releases)
    space.clean(r, forged(r, r.cache / "rel" / "1.4.0" / "igneumd"))
    assert rel.exists(), "a published release was deleted through a symlink in the cache"


@pytest.mark.parametrize("where", ["archive in cache", "releases in cache"])
def test_overlapping_folders_keep_the_archive_and_the_release_store(tmp_path: Path,
                                                                    where: str) -> None:
    """Holds: the archive and release store are asked before the cache."""
    state = tmp_path / "state"
    inner = state / "cache" / "inner"
    r = local(tmp_path, archive=inner) if where == "archive in cache" else \
        local(tmp_path, releases=inner)
    kept = put(inner / "x.bin")
    put(r.cache / "bundle.tar")
    put(r.root / "boxes.json")
    rev = space.review(r)
    space.clean(r, rev)
    assert kept.exists() and (r.root / "boxes.json").exists()
    assert not (r.cache / "bundle.tar").exists()


def test_a_malformed_local_part_is_refused_before_anything_goes(tmp_path: Path) -> None:
    """The agent validates a box's part; the operator's own local part is not validated, so a
    bad entry crashes the clean after the entries before it were deleted."""
    r = local(tmp_path)
    good = put(r.cache / "bundle-abc.tar")
    part = forged(r, good)
    part["categories"][0]["paths"].append(["only-a-path"])
    reviewed = {"schema": 1, "boxes": {}, "local": part}
    try:
        storage_ops.clean(None, reviewed, {}, r, False)  # type: ignore[arg-type]
    except FleetError:
        pass  # a usage error is fine, provided nothing went
    assert good.exists(), "half done: the local clean deleted, then crashed on a bad entry"


def test_a_box_part_that_is_not_an_object_is_an_error_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Box a is cleaned first (sorted), then b's part (a list) crashes the whole clean: a's
    report is lost though its files were deleted."""
    ran: list[str] = []

    def fake_run(cfg: Any, row: Row, command: str, **kw: Any) -> CompletedProcess[str]:
        ran.append(row.label)
        return CompletedProcess([], 0, '{"dry_run": false, "categories": {}, "skipped": [], '
                                '"refused": []}', "")

    monkeypatch.setattr(storage_ops.boxssh, "run", fake_run)
    row = Row("a", "vast", "live", "standing", "RTX 4090", 1, 0.3, "running",
              provider_id="1", ssh_host="h", ssh_port=22, host_key="k")
    reviewed = {"schema": 1, "boxes": {"a": {"provider_id": "1", "categories": []},
                                       "b": ["not", "a", "part"]}}
    row_b = Row("b", "vast", "live", "standing", "RTX 4090", 1, 0.3, "running",
                provider_id="2", ssh_host="h", ssh_port=22, host_key="k")
    done = storage_ops.clean(None, reviewed, {"a": row, "b": row_b},  # type: ignore[arg-type]
                             None, False)
    assert ran == ["a"] and "a" in done["boxes"] and "b" in done["errors"]
