"""The sandbox release store: stamped versions, recorded digests, deterministic builds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sandbox.releases import (
    PROGRAMS,
    VERSION_LINE,
    Release,
    build_store,
    by_version,
    latest,
    load_store,
    stamp,
)


def test_store_layout_and_manifest(store: list[Release]) -> None:
    assert [r.version for r in store] == ["1.4.0", "1.5.0"]
    dest = store[0].path.parent
    manifest = json.loads((dest / "releases.json").read_text())
    assert manifest == [r.to_json() for r in store]
    for row, rel in zip(manifest, store, strict=True):
        assert set(row) == {"version", "files", "node_sha16"}
        assert set(row["files"]) == set(PROGRAMS)
        for name, digest in row["files"].items():
            data = (dest / rel.version / name).read_bytes()
            assert digest == {"sha256": hashlib.sha256(data).hexdigest(),
                              "sha16": hashlib.sha256(data).hexdigest()[:16], "size": len(data)}
            assert (dest / rel.version / name).stat().st_mode & 0o777 == 0o755
            assert data.startswith(b"#!/usr/bin/env python3\n")
            assert f'VERSION = "{rel.version}"'.encode() in data
        assert row["node_sha16"] == row["files"]["igneumd"]["sha16"]


def test_versions_differ_and_builds_repeat(store: list[Release], tmp_path: Path) -> None:
    old, new = store
    for name in PROGRAMS:
        assert old.files[name].sha256 != new.files[name].sha256
    again = build_store(tmp_path / "again")
    assert [r.to_json() for r in again] == [r.to_json() for r in store]
    assert (tmp_path / "again" / "releases.json").read_bytes() == \
        (store[0].path.parent / "releases.json").read_bytes()


def test_lookups(store: list[Release]) -> None:
    dest = store[0].path.parent
    loaded = load_store(dest)
    assert [r.to_json() for r in loaded] == [r.to_json() for r in store]
    assert latest(loaded).version == "1.5.0"
    assert latest(list(reversed(loaded))).version == "1.5.0"
    assert by_version(loaded, "1.4.0").file("igneumd") == dest / "1.4.0" / "igneumd"
    with pytest.raises(LookupError, match="no release 9.9.9"):
        by_version(loaded, "9.9.9")
    with pytest.raises(LookupError):
        latest([])


def test_stamp_needs_exactly_one_version_line() -> None:
    assert stamp(f"x\n{VERSION_LINE}\n", "2.0.0") == b'x\nVERSION = "2.0.0"\n'
    with pytest.raises(ValueError):
        stamp("no version here\n", "2.0.0")
