"""Regenerate stubs.c: every symbol the amdsmi binding binds that amdsmi.c does not implement.

The binding's wrapper binds each symbol of libamd_smi.so by name when it is imported, so a
missing one fails the import. The stubs answer AMDSMI_STATUS_NOT_SUPPORTED instead, what the
real library says for a feature the card lacks. Run after upgrading amdsmi:

    python -m sandbox.amdsmi.gen_stubs
"""

from __future__ import annotations

import re
from importlib.util import find_spec
from pathlib import Path

from sandbox.standin import write_stubs

HERE = Path(__file__).resolve().parent


def wanted_symbols() -> list[str]:
    # the wrapper's text, not the module: importing it needs the library this file stands in for
    spec = find_spec("amdsmi")
    assert spec is not None and spec.submodule_search_locations, "amdsmi is not installed"
    text = (Path(spec.submodule_search_locations[0]) / "amdsmi_wrapper.py").read_text()
    return sorted(set(re.findall(r"_libraries\['libamd_smi\.so'\]\.([A-Za-z0-9_]+)", text)))


def write(source: Path = HERE / "amdsmi.c") -> int:
    """stubs.c beside `source` (the stand-in's C file); the number of stubs."""
    return write_stubs(source, wanted_symbols(), "the amdsmi binding",
                       "AMDSMI_STATUS_NOT_SUPPORTED", 2)


def main() -> None:
    print(f"stubs.c: {write()} stubs")


if __name__ == "__main__":
    main()
