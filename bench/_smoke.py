"""`--smoke`, shared by every benchmark: its smallest sizes, about a minute, so that CI runs it.

A benchmark that nothing runs rots: a guard lands, the benchmark's steps no longer pass it, and
no one notices until the figures are wanted. `./run.sh test` runs each benchmark with
`--smoke` (tests/bench); a smoke run checks the benchmark still runs end to end and prints its
figures, which mean nothing at that size. It never writes bench/out/, where full runs keep
theirs.
"""

from __future__ import annotations

import argparse
from typing import Any

HELP = ("smallest sizes, about a minute: checks the benchmark still runs (its figures mean "
        "nothing at this size; bench/out/ is left alone)")


def parse(ap: argparse.ArgumentParser, **smallest: Any) -> argparse.Namespace:
    """Parse the command line; with --smoke, each option named in `smallest` takes that value."""
    ap.add_argument("--smoke", action="store_true", help=HELP)
    args = ap.parse_args()
    if args.smoke:
        for name, value in smallest.items():
            if not hasattr(args, name):
                raise SystemExit(f"--smoke sets {name}, which this benchmark has no option for")
            setattr(args, name, value)
    return args
