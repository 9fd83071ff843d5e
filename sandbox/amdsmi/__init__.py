"""Stand-in AMD SMI: small C libraries that the amdsmi binding loads unchanged as ROCm's own.

`build_libraries` compiles libamd_smi.so (what the binding binds at import) and librocm-core.so
(what its amdsmi_get_rocm_version loads) into one directory: a ROCm install's `lib/`, found by
the binding through $ROCM_PATH or at /opt/rocm/lib. `write_config` writes the GPU world they
report (re-read at every amdsmi_init). See world.h and docs/agent.md.
"""

from __future__ import annotations

from pathlib import Path

from sandbox import standin
from sandbox.backend import GpuSpec
from sandbox.nvml import HERE as NVML_DIR

SMI_LIB = "libamd_smi.so"
ROCM_CORE_LIB = "librocm-core.so"
CONFIG_ENV = "SANDBOX_AMDSMI_CONFIG"
HANG_ENV = "SANDBOX_AMDSMI_HANG"
DEFAULT_CONFIG = Path("/run/sandbox/amdsmi.json")  # the box's read-only sys dir
ROCM_LIB_DIR = "opt/rocm/lib"  # where ROCm puts both libraries, relative to the root
HERE = Path(__file__).resolve().parent
HEADERS = [HERE / "world.h", NVML_DIR / "jsonread.h"]


def build_libraries(lib_dir: Path) -> list[Path]:
    """Compile both libraries into lib_dir (each unless a copy newer than its sources is
    there)."""
    return [
        standin.build(lib_dir / SMI_LIB, [HERE / "amdsmi.c", HERE / "stubs.c"], HEADERS),
        standin.build(lib_dir / ROCM_CORE_LIB, [HERE / "rocm_core.c"], HEADERS),
    ]


def write_config(path: Path, gpu: GpuSpec) -> None:
    """Write the world the stand-in reports (atomically: a reader never sees half a file)."""
    standin.write_world(path, gpu)
