"""The release store the fleet publishes from: `releases.json` beside one folder per version.

    <store>/releases.json   [{"version", "files": {name: {"sha256", "sha16", "size"}},
                              "node_sha16"}, ...]        (the manifest of every release)
    <store>/<version>/{igneumd, igneum-miner, igneum-prover}
    <store>/<version>/publish.json                       (the record of its publish, if any)

The sandbox's builder (`sandbox.releases`) writes the same shape. A release is addressed on
boxes by its node binary's sha16 (`/root/fleet/releases/<sha16>/`). Versions are immutable:
adding a version again with other files is refused. Files are copied into `<version>.partial`
and renamed into place; releases.json is replaced atomically under `releases.json.lock`.

Example:
    rel, added = add(Path("state/releases"), Path("build/1.6.0"), "1.6.0")
    find(Path("state/releases"), "1.6.0").node_sha16
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from fleet.core.errors import ConfigError, UsageError
from fleet.core.fileutil import locked, write_atomic

NODE_BINARY = "igneumd"  # the node binary's file name in a release (the agent's program is `node`)
MINER_BINARY = "igneum-miner"
PROVER_BINARY = "igneum-prover"
FILES = (NODE_BINARY, MINER_BINARY, PROVER_BINARY)
MANIFEST = "releases.json"


@dataclass(frozen=True)
class Release:
    version: str
    path: Path
    sha256: dict[str, str]  # file name -> sha256
    sizes: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def node_sha256(self) -> str:
        return self.sha256[NODE_BINARY]

    @property
    def node_sha16(self) -> str:
        return self.node_sha256[:16]

    @property
    def key(self) -> Version:
        return version_key(self.version)

    def to_json(self) -> dict[str, Any]:
        files = {n: {"sha256": s, "sha16": s[:16], "size": self.sizes.get(n)}
                 for n, s in sorted(self.sha256.items())}
        return {"version": self.version, "files": files, "node_sha16": self.node_sha16}


def version_key(version: str) -> Version:
    """The ordering key of a version (PEP 440, which also reads semver's `1.5.0-rc1`)."""
    try:
        return Version(version)
    except InvalidVersion:
        raise UsageError(f"bad version {version!r}: use a version such as 1.5.0 or "
                         "1.6.0rc1") from None


def _parse(store: Path, rows: Any) -> list[Release]:
    out = []
    try:
        for r in rows:
            out.append(Release(r["version"], store / r["version"],
                               {n: f["sha256"] for n, f in r["files"].items()},
                               {n: f["size"] for n, f in r["files"].items()
                                if f.get("size") is not None}))
    except (TypeError, KeyError, AttributeError) as e:
        raise ConfigError(f"{store / MANIFEST}: unexpected shape ({e!r})") from None
    return out


def load(store: Path) -> list[Release]:
    manifest = store / MANIFEST
    try:
        rows = json.loads(manifest.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{manifest}: no release store here") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{manifest}: not valid JSON: {e}") from None
    return _parse(store, rows)


def load_or_empty(store: Path) -> list[Release]:
    return load(store) if (store / MANIFEST).exists() else []


def find(store: Path, version: str) -> Release:
    """The release by version or node sha16; an unknown one is a usage error (exit 2)."""
    releases = load(store)
    for r in releases:
        if r.version == version or r.node_sha16 == version:
            return r
    known = ", ".join(r.version for r in sorted_releases(releases)) or "none"
    raise ConfigError(f"no release {version!r} in {store} (known: {known})")


def sorted_releases(releases: Iterable[Release]) -> list[Release]:
    return sorted(releases, key=lambda r: r.key)


def by_node_sha256(releases: Iterable[Release], sha256: str | None) -> Release | None:
    """The release whose node binary has this digest (full or sha16), if any."""
    key = (sha256 or "").lower()
    if len(key) not in (16, 64):
        return None
    return next((r for r in releases if r.node_sha256 == key or r.node_sha16 == key), None)


def by_file_sha256(releases: Iterable[Release], name: str, sha256: str | None) -> Release | None:
    if not sha256:
        return None
    return next((r for r in releases if r.sha256.get(name) == sha256), None)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(release: Release) -> list[str]:
    """What is wrong with a release's files in the store (missing, wrong size or digest)."""
    problems = []
    for name in FILES:
        want = release.sha256.get(name)
        path = release.path / name
        if want is None:
            problems.append(f"{name}: not in the manifest")
        elif not path.is_file():
            problems.append(f"{name}: missing ({path})")
        elif file_sha256(path) != want:
            problems.append(f"{name}: sha256 differs from the manifest")
    return problems


def check_usable(release: Release) -> None:
    """Refuse (exit 2) a release whose files are missing or differ from its manifest."""
    problems = verify(release)
    if problems:
        raise UsageError(f"release {release.version} in {release.path.parent} is not usable: "
                         + "; ".join(problems))


def add(store: Path, src: Path, version: str, replace: bool = False) -> tuple[Release, bool]:
    """Record the release in SRC (igneumd, igneum-miner, igneum-prover) as VERSION.

    Returns the release and whether anything changed. The same files again are a no-op; other
    files under a recorded version are refused unless `replace` (the sandbox's builder only).
    """
    version_key(version)
    if "/" in version or version.startswith("."):
        raise UsageError(f"bad version {version!r}")
    missing = [n for n in FILES if not (src / n).is_file()]
    if missing:
        raise UsageError(f"{src}: missing {', '.join(missing)} (a release has {', '.join(FILES)})")
    sha = {n: file_sha256(src / n) for n in FILES}
    sizes = {n: (src / n).stat().st_size for n in FILES}
    store.mkdir(parents=True, exist_ok=True)
    with locked(store / f"{MANIFEST}.lock"):
        releases = load_or_empty(store)
        old = next((r for r in releases if r.version == version), None)
        rel = Release(version, store / version, sha, sizes)
        if old is not None and old.sha256 == sha and not verify(old):
            return old, False
        if old is not None and old.sha256 != sha and not replace:
            raise UsageError(f"release {version} is already recorded with other files; "
                             "versions are immutable (add it under a new version)")
        clash = next((r for r in releases if r.version != version
                      and r.node_sha16 == rel.node_sha16), None)
        if clash is not None:
            raise UsageError(f"{src / NODE_BINARY} is release {clash.version}'s node binary; a "
                             "release needs a node of its own (boxes address releases by its "
                             "digest)")
        _copy(src, store / version, sha)
        rest = [r for r in releases if r.version != version]
        rows = [r.to_json() for r in sorted_releases([*rest, rel])]
        write_atomic(store / MANIFEST, json.dumps(rows, indent=2) + "\n")
    return rel, True


def _copy(src: Path, dest: Path, sha: dict[str, str]) -> None:
    """Copy the files into `<dest>.partial`, check them, then move them into `dest`.

    Files already in `dest` (a publish record) other than the release's are kept.
    """
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in FILES:
        shutil.copyfile(src / name, tmp / name)
        os.chmod(tmp / name, 0o755)
        if file_sha256(tmp / name) != sha[name]:
            raise UsageError(f"{src / name} changed while it was copied; try again")
    if not dest.exists():
        os.replace(tmp, dest)
        return
    for name in FILES:  # a version folder that already holds a record: file by file
        os.replace(tmp / name, dest / name)
    shutil.rmtree(tmp, ignore_errors=True)


def import_built(store: Path, built: Sequence[tuple[str, Path]]) -> list[Release]:
    """Record already-built release folders (the sandbox's), replacing same-version ones."""
    return [add(store, path, version, replace=True)[0] for version, path in built]
