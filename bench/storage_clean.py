"""A storage clean of 250,000 regenerable files on one box root, against the fleet's deadline.

    .venv/bin/python bench/storage_clean.py [--files 250000] [--deep]

Fills a temporary box root with old releases (1,000 files a folder) beside a running and a
recorded previous release, or with `--deep` a pip cache laid out as pip's own (`http-v2/`, five
levels of hex folders, one file a leaf: each file's folder is new to the clean), reviews it
and cleans by that review with the agent's own rules
(`agent.space`, as `python -m agent storage` and `storage clean` run them; the caches are
temporary folders too, so nothing of this machine is touched), and times each. Every listed
file must be freed, and the kept releases must survive. Target: the clean well within
`fleet.ops.storage.REVIEW_DEADLINE_S` (300 s).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import _smoke

from agent import space
from fleet.ops.storage import REVIEW_DEADLINE_S

PER_DIR = 1000


def fill(root: Path, caches: Path, files: int, deep: bool) -> None:
    for name in ("running", "previous"):
        (root / "releases" / name).mkdir(parents=True)
        (root / "releases" / name / "igneumd").write_bytes(b"x")
    (root / "standing.node").write_text(f"{root}/releases/running/igneumd\n")
    (root / "standing.node.previous").write_text(json.dumps(
        {"previous": f"{root}/releases/previous/igneumd", "previous_sha256": "aa" * 32,
         "to": f"{root}/releases/running/igneumd", "to_sha256": "bb" * 32}) + "\n")
    for i in range(files):
        if deep:
            h = f"{i:08x}"
            d = caches / ".cache" / "pip" / "http-v2" / h[0] / h[1] / h[2] / h[3] / h[4:]
            d.mkdir(parents=True, exist_ok=True)
        else:
            d = root / "releases" / f"old-{i // PER_DIR}"
            if i % PER_DIR == 0:
                d.mkdir()
        (d / f"f{i}").write_bytes(b"x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=250_000)
    ap.add_argument("--deep", action="store_true", help="a pip-like deep cache, not releases")
    args = _smoke.parse(ap, files=2_000)
    with tempfile.TemporaryDirectory(prefix="fleet-bench-storage-") as tmp:
        root, caches = Path(tmp) / "fleet", Path(tmp) / "caches"
        caches.mkdir()
        fill(root, caches, args.files, args.deep)

        def rules() -> space.Rules:
            return space.Rules.of(root, 5, home=caches, apt=caches / "apt")

        t0 = time.monotonic()
        reviewed = space.review(rules())
        t1 = time.monotonic()
        done = space.clean(rules(), reviewed)
        t2 = time.monotonic()
        freed = done["categories"]["pip cache" if args.deep else "old releases"]["files"]
        kept = all((root / "releases" / n / "igneumd").exists() for n in ("running", "previous"))
    result = {"files": args.files, "layout": "deep" if args.deep else "shallow",
              "review_s": round(t1 - t0, 2), "clean_s": round(t2 - t1, 2),
              "freed_files": freed, "kept_releases_survive": kept,
              "deadline_s": REVIEW_DEADLINE_S,
              "at": datetime.now(UTC).strftime("%Y-%m-%d"), "python": platform.python_version()}
    print(json.dumps(result))
    if freed != args.files or not kept or done["refused"] or done["skipped"]:
        raise SystemExit(f"the clean did not free exactly the {args.files} old files: {result}")


if __name__ == "__main__":
    main()
