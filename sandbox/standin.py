"""The sandbox's stand-in GPU libraries (NVML, AMD SMI): compiled with gcc once per change,
and the world they report written as JSON from a GpuSpec (re-read by the library at each init)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
from pathlib import Path

from sandbox.backend import GpuSpec


def build(out: Path, sources: list[Path], headers: list[Path] | None = None) -> Path:
    """Compile sources into the shared library `out` (its name is the soname) unless a copy
    newer than every source and header is there.

    Concurrent callers are safe: each compiles to its own temporary name and renames it in.
    """
    headers = headers or []
    out.parent.mkdir(parents=True, exist_ok=True)
    newest = max(src.stat().st_mtime for src in [*sources, *headers])
    if out.exists() and out.stat().st_mtime >= newest:
        return out
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    includes = sorted({f"-I{h.parent}" for h in headers})
    try:
        cmd = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-fvisibility=hidden", *includes,
               f"-Wl,-soname,{out.name}", "-o", tmp, *map(str, sources)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {out.name} failed: {done.stderr.strip()}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def write_world(path: Path, gpu: GpuSpec) -> None:
    """Write the world a stand-in reports (atomically: a reader never sees half a file)."""
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
