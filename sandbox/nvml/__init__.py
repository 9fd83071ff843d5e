"""Stand-in NVML: a small C library that nvidia-ml-py loads as libnvidia-ml.so.1.

`build_library` compiles it with gcc into a directory that goes on the box's library path;
`write_config` writes the GPU world it reports (re-read at every nvmlInit). See docs/agent.md.
"""

from __future__ import annotations

from pathlib import Path

from sandbox import standin
from sandbox.backend import GpuSpec

SONAME = "libnvidia-ml.so.1"
CONFIG_ENV = "SANDBOX_NVML_CONFIG"
DEFAULT_CONFIG = Path("/etc/sandbox-nvml.json")
SOURCES = ("nvml.c", "stubs.c")
HEADERS = ("jsonread.h",)
HERE = Path(__file__).resolve().parent


def build_library(dest_dir: Path) -> Path:
    """Compile libnvidia-ml.so.1 into dest_dir unless a copy newer than the sources is there."""
    return standin.build(dest_dir / SONAME, [HERE / name for name in SOURCES],
                         [HERE / name for name in HEADERS])


def write_config(path: Path, gpu: GpuSpec) -> None:
    """Write the world the stand-in reports (atomically: a reader never sees half a file)."""
    standin.write_world(path, gpu)
