"""The example's parity gate: the toolchain's kernels are present and well formed. Prints a
pytest-style summary line, which the agent records as the gate's pass count."""

import sys
from pathlib import Path

checks = 0
for ptx in sorted(Path("toolchain/kernels").glob("*.ptx")):
    text = ptx.read_text()
    assert ".version" in text and ".entry" in text, f"{ptx}: not a PTX module"
    checks += 2
manifest = Path("toolchain/VERSION").read_text().strip()
assert manifest, "toolchain/VERSION is empty"
checks += 1
if checks < 4:
    print(f"{checks} passed, 1 failed")
    sys.exit(1)
print(f"{checks} passed")
