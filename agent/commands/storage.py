"""`python -m agent storage [--json]` and `python -m agent storage clean --from FILE|- [--dry-run]`.

The review reads only: every category of what fills the box (agent/base/space.py), with its
size, file count and oldest file, and what a cleanup would free. The clean deletes only what
a saved review listed as regenerable, file by file, where the rules still say so and the file
still has the size and mtime the review recorded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from agent import space
from agent.base.config import Config
from agent.base.errors import usage_error

MAX_REVIEW_BYTES = 256 << 20  # a review file larger than this is not one


def review(cfg: Config) -> dict[str, Any]:
    return space.review(space.Rules.of(cfg.root, cfg.log_keep))


def clean(cfg: Config, source: str, dry_run: bool) -> dict[str, Any]:
    """Clean by the review in `source` (a path, or - for stdin); a review that is not one is
    a usage error and deletes nothing."""
    try:
        text = sys.stdin.read(MAX_REVIEW_BYTES + 1) if source == "-" else \
            Path(source).read_text()
    except OSError as e:
        raise usage_error(f"review {source} unreadable: {e.strerror}") from None
    if len(text) > MAX_REVIEW_BYTES:
        raise usage_error(f"review {source} is larger than {MAX_REVIEW_BYTES} bytes")
    try:
        reviewed = json.loads(text)
    except ValueError as e:
        raise usage_error(f"review {source} is not JSON: {e}") from None
    if not isinstance(reviewed, dict) or not isinstance(reviewed.get("categories"), list) \
            or reviewed.get("root") != str(cfg.root):
        raise usage_error(f"review {source} is not a storage review of {cfg.root}")
    for cat in reviewed["categories"]:
        paths = cat.get("paths") if isinstance(cat, dict) else None
        if not isinstance(paths, list) or not all(
                isinstance(p, list) and len(p) >= 3 and isinstance(p[0], str)
                and all(isinstance(v, int) for v in p[1:3]) for p in paths):
            raise usage_error(f"review {source}: a category's paths are not [path, size, "
                              "mtime_ns, ...] lists")
    return space.clean(space.Rules.of(cfg.root, cfg.log_keep), reviewed, dry_run)
