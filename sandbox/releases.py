"""The sandbox's release store: versioned builds of the simulators with recorded digests.

`build_store(dest)` stamps each version into the simulator sources (`sandbox/sim/`) and writes

    dest/<version>/{igneumd,igneum-miner,igneum-prover}    mode 0755
    dest/releases.json    [{"version", "files": {name: {"sha256", "sha16", "size"}}, "node_sha16"}]

The build is deterministic: the same sources and version give the same digests, and versions
differ in digest because the version is part of each file. A deploy copies a release to
`/root/fleet/releases/<node_sha16>/` on a box and points `/root/fleet/standing.node` at its node.

Example:
    releases = build_store(Path(".sandbox/releases"))
    node = latest(releases).file("igneumd")
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SIM_DIR = Path(__file__).with_name("sim")
PROGRAMS = {  # released name -> source file in sandbox/sim/
    "igneumd": "igneumd.py",
    "igneum-miner": "igneum_miner.py",
    "igneum-prover": "igneum_prover.py",
}
NODE = "igneumd"
VERSIONS = ("1.4.0", "1.5.0")
VERSION_LINE = 'VERSION = "dev"  # stamped by sandbox.releases'


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size: int

    @property
    def sha16(self) -> str:
        return self.sha256[:16]


@dataclass(frozen=True)
class Release:
    version: str
    path: Path  # dest/<version>
    files: dict[str, FileDigest]

    @property
    def node_sha16(self) -> str:
        return self.files[NODE].sha16

    def file(self, name: str) -> Path:
        return self.path / name

    def to_json(self) -> dict[str, Any]:
        files = {n: {"sha256": d.sha256, "sha16": d.sha16, "size": d.size}
                 for n, d in sorted(self.files.items())}
        return {"version": self.version, "files": files, "node_sha16": self.node_sha16}


def stamp(source: str, version: str) -> bytes:
    """The source with its version line set to `version`."""
    if source.count(VERSION_LINE) != 1:
        raise ValueError(f"expected exactly one {VERSION_LINE!r} line to stamp")
    return source.replace(VERSION_LINE, f'VERSION = "{version}"').encode()


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def build_store(dest: Path, versions: Sequence[str] = VERSIONS) -> list[Release]:
    """Build every version into dest and record the digests in dest/releases.json."""
    releases = []
    for version in versions:
        vdir = dest / version
        vdir.mkdir(parents=True, exist_ok=True)
        files = {}
        for name, source in PROGRAMS.items():
            data = stamp((SIM_DIR / source).read_text(), version)
            _write_atomic(vdir / name, data, 0o755)
            files[name] = FileDigest(hashlib.sha256(data).hexdigest(), len(data))
        releases.append(Release(version, vdir, files))
    manifest = json.dumps([r.to_json() for r in releases], indent=2) + "\n"
    _write_atomic(dest / "releases.json", manifest.encode())
    return releases


def load_store(dest: Path) -> list[Release]:
    """The releases recorded in dest/releases.json."""
    rows = json.loads((dest / "releases.json").read_text())
    return [
        Release(row["version"], dest / row["version"],
                {n: FileDigest(f["sha256"], f["size"]) for n, f in row["files"].items()})
        for row in rows
    ]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def latest(releases: Sequence[Release]) -> Release:
    """The highest version."""
    if not releases:
        raise LookupError("the release store is empty")
    return max(releases, key=lambda r: _version_key(r.version))


def by_version(releases: Sequence[Release], version: str) -> Release:
    for release in releases:
        if release.version == version:
            return release
    known = ", ".join(r.version for r in releases) or "none"
    raise LookupError(f"no release {version} in the store (known: {known})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m sandbox.releases DEST", file=sys.stderr)
        sys.exit(2)
    for rel in build_store(Path(sys.argv[1])):
        print(f"{rel.version}  node {rel.node_sha16}  {rel.path}")
