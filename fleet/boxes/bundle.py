"""What a deploy ships to a box, packed so that a box needs one upload and no package index.

The agent bundle holds the agent's code, the wheels of its dependencies (psutil; nvidia-ml-py
and amdsmi, the GPU libraries' bindings; for one-shot jobs pyelftools and huggingface_hub with
what it needs at run time) and the scripts of `in/`. The wheels are the box's, not the
operator's: pip is asked for CPython 3.11 on manylinux x86_64 (the boxes run Debian's python3;
psutil's abi3 wheel serves every CPython from 3.6 on, so a newer python3 on the box is fine
too), and they are kept in a local cache between runs. A cached wheel is used only when its
name, version and tags fit the pins and the box; another version or another platform in the
cache is ignored.
The bundle is a deterministic tarball (`fleet.core.tarball`), so its sha256 names exactly one
content and the box can compare stamps instead of files.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from agent import contract
from fleet.core.errors import FleetError
from fleet.core.fileutil import locked, write_atomic
from fleet.core.paths import BOX_FILES, user_cache
from fleet.core.tarball import Entry, deterministic_tar

AGENT_CODE = Path(contract.__file__).resolve().parent  # the agent package, shipped whole

# the agent's runtime dependencies, pinned as in pyproject.toml (and, for huggingface_hub's own
# dependencies, as in the environment that runs the tests). huggingface_hub is shipped with
# what its import and `snapshot_download` over plain HTTP(S) really load when Xet is disabled
# (the job fetch sets HF_HUB_DISABLE_XET): httpx2 -> httpcore2 -> h11, idna, truststore (the
# system's CA store: no certifi), filelock, tqdm, pyyaml (pure Python when its C part does not
# fit the box's Python), typing_extensions. Left out on purpose: hf_xet (a 4 MiB native
# client the fetch never uses), click (the `hf` CLI), fsspec (HfFileSystem), packaging, and
# anyio (httpcore2's async backend; the fetch is synchronous).
AGENT_WHEELS = (
    "psutil==7.2.2", "nvidia-ml-py==13.615.71", "amdsmi==7.0.2",
    "pyelftools==0.33", "huggingface_hub==2.4.0",
    "httpx2==2.16.2", "httpcore2==2.16.2", "h11==0.16.0", "idna==3.20", "truststore==0.10.5",
    "filelock==4.3.1", "tqdm==4.70.1", "pyyaml==6.0.4", "typing_extensions==4.16.0",
)
# the box: Debian's CPython 3.11 on x86_64 with glibc >= 2.28 (Debian 10 and every image since)
BOX_PYTHON = (3, 11)
BOX_PLATFORMS = (
    "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
    "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64",
)


@dataclass(frozen=True)
class Bundle:
    path: Path
    sha256: str

    @property
    def sha16(self) -> str:
        return self.sha256[:16]


def box_tags() -> list[Tag]:
    """The wheel tags the box's interpreter accepts, most specific first (as pip ranks them)."""
    abi = f"cp{BOX_PYTHON[0]}{BOX_PYTHON[1]}"
    return [*cpython_tags(BOX_PYTHON, abis=[abi], platforms=BOX_PLATFORMS),
            *compatible_tags(BOX_PYTHON, interpreter=abi, platforms=BOX_PLATFORMS)]


def pip_download_command(dest: Path, pins: tuple[str, ...] = AGENT_WHEELS) -> list[str]:
    """`pip download` of the pinned wheels for the box's platform and Python, into dest."""
    platforms = [arg for p in BOX_PLATFORMS for arg in ("--platform", p)]
    return [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
            "--only-binary=:all:", "--no-deps", *platforms,
            "--python-version", ".".join(map(str, BOX_PYTHON)), "--implementation", "cp",
            "--abi", f"cp{BOX_PYTHON[0]}{BOX_PYTHON[1]}", "-d", str(dest), *pins]


def _pick(dest: Path, pins: tuple[str, ...]) -> tuple[list[Path], list[str]]:
    """The cached wheel for each pin (exact name and version, a tag the box accepts): the
    found wheels and the pins that have none."""
    rank = {tag: i for i, tag in enumerate(box_tags())}
    best: dict[str, tuple[int, Path]] = {}
    wanted = {}
    for pin in pins:
        req = Requirement(pin)
        (spec,) = req.specifier  # pins are exact: name==version
        wanted[canonicalize_name(req.name)] = (Version(spec.version), pin)
    for path in sorted(dest.glob("*.whl")) if dest.is_dir() else []:
        try:
            name, version, _, tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if name not in wanted or version != wanted[name][0]:
            continue  # another package, or a stale version of ours
        fits = [rank[t] for t in tags if t in rank]
        if fits and (name not in best or min(fits) < best[name][0]):
            best[name] = (min(fits), path)
    found = [best[n][1] for n in wanted if n in best]
    missing = [pin for n, (_, pin) in wanted.items() if n not in best]
    return found, missing


def _download_wheels(dest: Path, pins: tuple[str, ...] = AGENT_WHEELS) -> list[Path]:
    """The box's wheels for the pins, from the cache in dest or fetched into it."""
    found, missing = _pick(dest, pins)
    if not missing:
        return sorted(found)
    dest.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(pip_download_command(dest, pins), capture_output=True, text=True)
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines() or [f"pip exited with {r.returncode}"]
        raise FleetError(f"cannot fetch the agent's wheels: {lines[-1]}")
    found, missing = _pick(dest, pins)
    if missing:
        raise FleetError(f"cannot fetch the agent's wheels: pip left no {missing[0]} wheel "
                         f"for the box (CPython {BOX_PYTHON[0]}.{BOX_PYTHON[1]}, "
                         f"{BOX_PLATFORMS[0]}) in {dest}")
    return sorted(found)


def wheel_cache() -> Path:
    """Where the agent's wheels are kept between runs and state folders (one download)."""
    return user_cache() / "wheels"


def fetch_wheels() -> list[Path]:
    """The agent's wheels in the shared cache, fetched once (`./run.sh test` fetches them before
    benchmarks run where no route out exists)."""
    with locked(wheel_cache().parent / ".wheels.lock"):
        return _download_wheels(wheel_cache())


def build(cache: Path) -> Bundle:
    """Pack agent/, the wheels and in/ into cache/agent-<sha16>.tar.gz (reused if unchanged)."""
    with locked(cache / ".bundle.lock"):
        wheels = fetch_wheels()
        entries: list[Entry] = []
        for p in sorted(AGENT_CODE.rglob("*.py")):
            entries.append(Entry(f"agent/{p.relative_to(AGENT_CODE)}", p.read_bytes()))
        for p in wheels:
            entries.append(Entry(f"wheels/{p.name}", p.read_bytes()))
        for p in sorted(BOX_FILES.glob("*")):
            if p.is_file():
                entries.append(Entry(f"in/{p.name}", p.read_bytes(), 0o755))
        data = deterministic_tar(entries, gzip=True)
        sha = hashlib.sha256(data).hexdigest()
        out = cache / f"agent-{sha[:16]}.tar.gz"
        if not out.exists():
            write_atomic(out, data)
        return Bundle(out, sha)
