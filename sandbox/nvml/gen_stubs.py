"""Regenerate stubs.c: every NVML symbol pynvml may resolve that nvml.c does not implement.

pynvml looks functions up by name at call time; a missing symbol raises FunctionNotFound, which
real drivers never do for their own version's API. The stubs answer NVML_ERROR_NOT_SUPPORTED
instead, which is what a card lacking the feature says. Run after upgrading nvidia-ml-py:

    python -m sandbox.nvml.gen_stubs
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from sandbox.standin import write_stubs

HERE = Path(__file__).resolve().parent


def wanted_symbols() -> list[str]:
    import pynvml  # imported here: only the generator needs it

    text = inspect.getsource(pynvml)
    return sorted(set(re.findall(r'_nvmlGetFunctionPointer\("([A-Za-z0-9_]+)"\)', text)))


def write(source: Path = HERE / "nvml.c") -> int:
    """stubs.c beside `source` (the stand-in's C file); the number of stubs."""
    return write_stubs(source, wanted_symbols(), "nvidia-ml-py", "NVML_ERROR_NOT_SUPPORTED", 3)


def main() -> None:
    print(f"stubs.c: {write()} stubs")


if __name__ == "__main__":
    main()
