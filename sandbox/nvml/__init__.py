"""Stand-in NVML: a small C library that nvidia-ml-py loads as libnvidia-ml.so.1.

`build_library` compiles it with gcc into a directory that goes on the box's library path;
`write_config` writes the GPU world it reports (re-read at every nvmlInit). See docs/agent.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
from pathlib import Path

from sandbox.backend import GpuSpec

SONAME = "libnvidia-ml.so.1"
CONFIG_ENV = "SANDBOX_NVML_CONFIG"
DEFAULT_CONFIG = Path("/etc/sandbox-nvml.json")
SOURCES = ("nvml.c", "stubs.c")
_HERE = Path(__file__).resolve().parent


def build_library(dest_dir: Path) -> Path:
    """Compile libnvidia-ml.so.1 into dest_dir unless a copy newer than the sources is there.

    Concurrent callers are safe: each compiles to its own temporary name and renames it in.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / SONAME
    sources = [_HERE / name for name in SOURCES]
    newest = max(src.stat().st_mtime for src in sources)
    if out.exists() and out.stat().st_mtime >= newest:
        return out
    fd, tmp = tempfile.mkstemp(prefix=".libnvidia-ml.", dir=dest_dir)
    os.close(fd)
    try:
        cmd = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-fvisibility=hidden",
               f"-Wl,-soname,{SONAME}", "-o", tmp, *map(str, sources)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {SONAME} failed: {done.stderr.strip()}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def write_config(path: Path, gpu: GpuSpec) -> None:
    """Write the world the stand-in reports (atomically: a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(dataclasses.asdict(gpu), f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
