"""What a deploy ships to a box, packed so that a box needs one upload and no package index.

The agent bundle holds the agent's code, the wheels of its two dependencies (psutil,
nvidia-ml-py: downloaded once from PyPI into a local cache) and the scripts of `in/`. It is a
deterministic tarball (sorted names, zero mtimes), so its sha256 names exactly one content and
the box can compare stamps instead of files.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import FleetError
from fleet.fileutil import locked, write_atomic

REPO = Path(__file__).resolve().parent.parent
# the agent's runtime dependencies, pinned as in pyproject.toml
AGENT_WHEELS = ("psutil==7.2.2", "nvidia-ml-py==13.615.71")


@dataclass(frozen=True)
class Bundle:
    path: Path
    sha256: str

    @property
    def sha16(self) -> str:
        return self.sha256[:16]


def _download_wheels(dest: Path) -> list[Path]:
    have = sorted(dest.glob("*.whl"))
    names = {p.name.split("-")[0].lower().replace("_", "-") for p in have}
    if {"psutil", "nvidia-ml-py"} <= names:
        return have
    dest.mkdir(parents=True, exist_ok=True)
    # boxes run Debian's CPython 3.11 on the operator's architecture
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps",
           "-d", str(dest), *AGENT_WHEELS]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise FleetError(f"cannot fetch the agent's wheels: {r.stderr.strip().splitlines()[-1:]}")
    return sorted(dest.glob("*.whl"))


def _add(tar: tarfile.TarFile, arcname: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode, info.mtime, info.uname, info.gname = len(data), mode, 0, "root", "root"
    tar.addfile(info, io.BytesIO(data))


def wheel_cache() -> Path:
    """Where the agent's wheels are kept between runs and state folders (one download)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fleet" / "wheels"


def build(cache: Path) -> Bundle:
    """Pack agent/, the wheels and in/ into cache/agent-<sha16>.tar.gz (reused if unchanged)."""
    with locked(cache / ".bundle.lock"):
        with locked(wheel_cache().parent / ".wheels.lock"):
            wheels = _download_wheels(wheel_cache())
        files: list[tuple[str, Path, int]] = []
        for p in sorted((REPO / "agent").rglob("*.py")):
            files.append((f"agent/{p.relative_to(REPO / 'agent')}", p, 0o644))
        for p in wheels:
            files.append((f"wheels/{p.name}", p, 0o644))
        for p in sorted((REPO / "in").glob("*")):
            if p.is_file():
                files.append((f"in/{p.name}", p, 0o755))
        raw = io.BytesIO()
        # gzip's header carries an mtime: zero it so equal contents give equal digests
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for arc, path, mode in files:
                _add(tar, arc, path.read_bytes(), mode)
        data = raw.getvalue()
        sha = hashlib.sha256(data).hexdigest()
        out = cache / f"agent-{sha[:16]}.tar.gz"
        if not out.exists():
            write_atomic(out, data)
        return Bundle(out, sha)
