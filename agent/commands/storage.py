"""`python -m agent storage [--json]` and `python -m agent storage clean --from FILE|- [--dry-run]`.

The review reads only: every category of what fills the box (agent/space.py), with its
size, file count and oldest file, and what a cleanup would free. The clean deletes only what
a saved review listed as regenerable, file by file, where the rules still say so and the file
still has the size and mtime the review recorded, holding the switch lock throughout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, cast

from agent import space
from agent.base.config import Config
from agent.base.errors import AgentError, usage_error
from agent.base.lock import AgentLock
from agent.contract import StorageReview

MAX_REVIEW_BYTES = 256 << 20  # a review file larger than this is not one


def review(cfg: Config) -> StorageReview:
    return cast(StorageReview, space.review(space.Rules.of(cfg.root, cfg.log_keep)))


def clean(cfg: Config, source: str, dry_run: bool, lock_wait_s: float = 600.0,
          keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Clean by the review in `source` (a path, or - for stdin), keeping the releases named
    in `keep` too; a review that is not one is a usage error and deletes nothing."""
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
    problem = space.invalid(reviewed)
    if problem:
        raise usage_error(f"review {source} is not a storage review: {problem}")
    if reviewed.get("root") != str(cfg.root):
        raise usage_error(f"review {source} is not a storage review of {cfg.root}")
    # no switch lands while files go: the pointer the rules read stays the pointer
    lock = AgentLock(cfg.layout.switch_lock)
    try:
        held = lock.acquire_within(lock_wait_s)
    except OSError as e:  # a full disk cannot create the lock file: then no switch holds it
        if cfg.layout.switch_lock.exists():
            raise AgentError(f"cannot take {cfg.layout.switch_lock}: {e.strerror}") from None
        held = True
    if not held:
        raise AgentError(f"a switch has held {cfg.layout.switch_lock} for {lock_wait_s:.0f} s: "
                         "nothing deleted; clean again once it ended")
    try:
        return space.clean(space.Rules.of(cfg.root, cfg.log_keep, keep=keep), reviewed,
                           dry_run)
    finally:
        lock.release()

