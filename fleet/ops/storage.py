"""`fleet storage review` and `fleet storage clean`: what fills the standing boxes and the
operator's own state, and a cleanup of regenerable files only, by a saved review.

The review changes nothing anywhere: one SSH command a box through its agent (`python -m agent
storage`, whose rules, `agent.space`, know what the agent wrote), and the same review of the
operator's state folder with its own rules (`LocalRules`). The clean sends each box its part
of a saved review (`python -m agent storage clean --from -`); the agent deletes only what the
rules still call regenerable and what still has the size and mtime the review recorded, so a
hand-edited review can name a kept file and it is refused for that file.

A review file (`--json`, saved by the operator):

    {"schema": 1, "at": "2026-12-04T17:00:00Z",
     "boxes": {label: {"provider_id": ..., agent review: root, disk, categories, ...}},
     "errors": {label: why},               boxes whose review could not be read
     "local": {review of the state folder} (with --archive)
     "freeable_bytes": n}
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from agent import space
from agent.contract import ROOT, VENV_PYTHON, StorageReview
from fleet.boxes import boxssh
from fleet.core.boxes import Row
from fleet.core.config import Config
from fleet.core.errors import FleetError, UsageError
from fleet.core.times import now_iso

SCHEMA = 1
REVIEW = f"cd {ROOT} && {VENV_PYTHON} -m agent storage --json"
CLEAN = f"cd {ROOT} && {VENV_PYTHON} -m agent storage clean --from -"
REVIEW_DEADLINE_S = 300.0  # walking a box's disk; a clean deletes as long

LOCAL_CATEGORIES: dict[str, tuple[bool, str]] = {
    "build cache": (True, "agent bundles and release tarballs the deploys build again"),
    "archive": (False, "outputs read back from the boxes: anything under the store's archive"),
    "release store": (False, "the releases the fleet publishes"),
    "fleet state": (False, "the registry, the loop's memory, the page and the rest"),
    "sandbox leftovers": (True, "a stopped sandbox's files: `fleet sandbox up` makes them again"),
    "sandbox in use": (False, "the sandbox runs (or whether it runs cannot be told)"),
}


@dataclass(frozen=True)
class LocalRules:
    """The operator's state folder (beside the registry), its build cache, archive and
    release store, with the same review and clean as a box's (`agent.space`)."""

    root: Path
    cache: Path
    archive: Path
    releases: Path
    sandbox: Path | None = None  # the sandbox's folder, where it has one
    sandbox_running: bool = True

    @classmethod
    def of(cls, cfg: Config, archive: Path, sandbox: Path | None = None,
           sandbox_running: bool = True) -> LocalRules:
        state = cfg.registry.parent
        return cls(state, state / "cache", archive, cfg.releases, sandbox, sandbox_running)

    @property
    def categories(self) -> dict[str, tuple[bool, str]]:
        return LOCAL_CATEGORIES

    def tops(self) -> list[Path]:
        tops: list[Path] = []
        for t in (self.root, self.archive, self.releases, *filter(None, [self.sandbox])):
            if not any(t == o or o in t.parents for o in tops):
                tops.append(t)
        return tops

    def category(self, path: Path) -> str | None:
        sandbox = "sandbox in use" if self.sandbox_running else "sandbox leftovers"
        for name, top in (("archive", self.archive), ("release store", self.releases),
                          (sandbox, self.sandbox), ("build cache", self.cache),
                          ("fleet state", self.root)):
            if top is not None and (path == top or top in path.parents):
                return name
        return None

    def keeps(self, path: Path) -> bool:
        return path in (self.root, self.cache, self.archive, self.releases, self.sandbox)

    @property
    def problem(self) -> str | None:
        return None  # fixed paths: nothing to read

    def now(self) -> LocalRules:
        return self  # the local rules are fixed paths


def printable(text: Any) -> str:
    """`text` with every character a terminal would act on written as its escape (`\\x1b`):
    a box's file names, categories and messages are not trusted to be plain."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in str(text))


def unknown_category(part: Any, known: dict[str, tuple[bool, str]]) -> str | None:
    """Why a box's review or clean report (`part`: its categories a list of objects or a
    dict by name) names a category the rules do not know, or None."""
    cats = part.get("categories") if isinstance(part, dict) else None
    names = list(cats) if isinstance(cats, dict) else \
        [c.get("name") if isinstance(c, dict) else c for c in cats or []]
    for name in names:
        if not isinstance(name, str) or name not in known:
            return f"unknown category '{printable(name)}'"
    return None


class BoxReview(StorageReview):
    """A box's part of the review: its agent's, and the provider's id of the box it read."""

    provider_id: str | None


def review(cfg: Config, rows: Sequence[Row], local: LocalRules | None) -> dict[str, Any]:
    """The review of `rows` (their boxes, in parallel) and of the local state (with
    `local`). A box whose review cannot be read is named in `errors`, never guessed."""
    def one(row: Row) -> StorageReview | str:
        try:
            r = boxssh.run(cfg, row, REVIEW, timeout=REVIEW_DEADLINE_S)
        except FleetError as e:
            return str(e)
        if r.returncode != 0:
            return f"the agent's storage review failed: {(r.stderr or r.stdout).strip()[-300:]}"
        try:
            doc = json.loads(r.stdout)
        except ValueError:
            return "the agent's storage review is not JSON"
        if not isinstance(doc, dict):
            return "the agent's storage review is not a review"
        unknown = unknown_category(doc, space.CATEGORIES)
        return f"the agent's storage review names an {unknown}" if unknown else \
            cast(StorageReview, doc)
    with ThreadPoolExecutor(max_workers=16) as pool:
        reads = list(pool.map(one, rows))
    boxes: dict[str, BoxReview] = {}
    errors: dict[str, str] = {}
    for row, got in zip(rows, reads, strict=True):
        if isinstance(got, str):
            errors[row.label] = got
        else:
            boxes[row.label] = {"provider_id": row.provider_id, **got}
    out: dict[str, Any] = {"schema": SCHEMA, "at": now_iso(), "boxes": boxes, "errors": errors}
    if local is not None:
        out["local"] = space.review(local)
    out["freeable_bytes"] = sum(int(b.get("freeable_bytes") or 0) for b in boxes.values()) + \
        int((out.get("local") or {}).get("freeable_bytes") or 0)
    return out


def load_review(path: Path) -> dict[str, Any]:
    """A saved review, or a UsageError that says why it is not one."""
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"review {path}: {e.strerror}") from None
    except ValueError as e:
        raise UsageError(f"review {path} is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA \
            or not isinstance(doc.get("boxes"), dict):
        raise UsageError(f"review {path} is not a fleet storage review (schema {SCHEMA})")
    parts = [(printable(label), part, space.CATEGORIES) for label, part in doc["boxes"].items()]
    if "local" in doc:
        parts.append(("local", doc["local"], LOCAL_CATEGORIES))
    for label, part, known in parts:
        unknown = unknown_category(part, known)
        if unknown:
            raise UsageError(f"review {path}: {label}: {unknown}")
    return doc


def keep_wanted(row: Row) -> str:
    """The box's clean keeps the release the registry wants on it (a publish may not have
    staged it there yet)."""
    wanted = row.node_sha16_wanted
    return f" --keep {wanted}" if wanted and re.fullmatch(r"[0-9a-f]{16}", wanted) else ""


def clean(cfg: Config, reviewed: dict[str, Any], rows: dict[str, Row],
          local: LocalRules | None, dry_run: bool) -> dict[str, Any]:
    """Each reviewed box cleaned by its part of the review (only while the registry still
    holds that very box, live), and the local state with `local`."""
    boxes: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for label, part in sorted(reviewed["boxes"].items()):
        row = rows.get(label)
        problem = space.invalid(part)
        if problem:
            errors[label] = f"its part of the review is not one ({problem}): nothing deleted"
            continue
        if row is None or not row.live or row.provider_id != part.get("provider_id"):
            errors[label] = "not the live box the review read: nothing deleted"
            continue
        command = CLEAN + (" --dry-run" if dry_run else "") + keep_wanted(row)
        try:
            r = boxssh.run(cfg, row, command, timeout=REVIEW_DEADLINE_S,
                           stdin=json.dumps(part))
        except FleetError as e:
            errors[label] = str(e)
            continue
        try:
            report = json.loads(r.stdout) if r.returncode == 0 else None
        except ValueError:
            report = None
        unknown = unknown_category(report, space.CATEGORIES) if isinstance(report, dict) \
            else None
        if report is None:
            errors[label] = f"the agent's clean failed: {(r.stderr or r.stdout).strip()[-300:]}"
        elif unknown:
            errors[label] = f"the agent's clean report names an {unknown}"
        else:
            boxes[label] = report
    out: dict[str, Any] = {"dry_run": dry_run, "boxes": boxes, "errors": errors}
    if local is not None and "local" in reviewed:
        problem = space.invalid(reviewed["local"])
        if problem:
            errors["local"] = f"the review's local part is not one ({problem}): nothing deleted"
        elif reviewed["local"].get("root") != str(local.root):
            errors["local"] = f"the review's local state is not {local.root}: nothing deleted"
        else:
            out["local"] = space.clean(local, reviewed["local"], dry_run)
    return out
