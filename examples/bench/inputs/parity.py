"""The example's parity gate: the toolchain's kernels are present and well formed. Ends its
output with a pytest-style summary line (`N passed in S.SSs`), which the agent reads as the
gate's test counts: a gate passes only on such a line with passes and no failure."""

import sys
import time
from pathlib import Path

started = time.monotonic()

checks = 0
for ptx in sorted(Path("toolchain/kernels").glob("*.ptx")):
    text = ptx.read_text()
    assert ".version" in text and ".entry" in text, f"{ptx}: not a PTX module"
    checks += 2
manifest = Path("toolchain/VERSION").read_text().strip()
assert manifest, "toolchain/VERSION is empty"
checks += 1
took = time.monotonic() - started
if checks < 4:
    print(f"1 failed, {checks} passed in {took:.2f}s")
    sys.exit(1)
print(f"{checks} passed in {took:.2f}s")
