"""`python -m sandbox serve --dir DIR [--seed N] [--backend null|ns] [--boot-delay S]`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from sandbox.daemon import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandbox")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="run the fake provider APIs until SIGTERM")
    run.add_argument("--dir", type=Path, required=True, help="state directory")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--backend", default="null", help="null | ns | module:Class")
    run.add_argument("--boot-delay", type=float, default=1.0, help="seconds to running")
    run.add_argument("--notice-delay", type=float, default=5.0,
                     help="seconds before a dead host shows in the APIs")
    run.add_argument("--machines", type=int, default=16, help="machines per provider")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(args.dir, args.seed, args.backend, args.boot_delay, args.notice_delay, args.machines)


if __name__ == "__main__":
    main()
