"""What fills a box, by what the agent knows it wrote, and what a cleanup may delete: part of
the agent's contract (it imports nothing but agent.contract), so the operator's side reviews
its own files (`fleet.ops.storage`) with the same review and clean.

The rules live here once: the review (`python -m agent storage`) and the clean (`python -m
agent storage clean`) ask the same `category` of every path, so a clean never deletes what
the rules keep, whatever a review file says. A box's rules (`Rules`), regenerable:

- releases/<d>: a release no pointer, agent.toml or previous-release record names (the
  previous release is the one `agent switch` moved away from; where none is recorded, the
  newest other release stands for it);
- rotated logs numbered beyond the rotation window (`log_keep`): `<log>.<n>`, n > log_keep;
- pip, Hugging Face and apt caches (~/.cache/pip, ~/.cache/huggingface, apt's archives), and
  the agent's own toolchain cache (cache/: the Hub's downloads) while no job runs;
- old pack exports: the pack directory's siblings `pack.*` (the pack itself is kept);
- finished recovery snapshots: snapshots/*, unless a recovery runs now (or the state cannot
  be read: then they are kept).

Kept: the running, previous and wanted releases, current logs and those within the window,
jobs/ (outputs the operator reads back), the miner's pack, models/, everything else under the
root, and anything outside it that the fleet did not write (never scanned).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from agent.contract import (
    CONFIG,
    JOB_STATE,
    JOBS,
    LOGS,
    OUT,
    POINTER,
    POINTER_PREVIOUS,
    RELEASES,
    RUN,
    TERMINAL,
)

ROTATED = re.compile(r"^(?P<log>.+)\.(?P<n>[0-9]+)$")

# category -> (regenerable, why), in the order a review lists them
CATEGORIES: dict[str, tuple[bool, str]] = {
    "old releases": (True, "releases no pointer, agent.toml or previous record names"),
    "rotated logs": (True, "rotated copies beyond the rotation window"),
    "pip cache": (True, "downloaded packages pip fetches again"),
    "huggingface cache": (True, "downloads the store serves again"),
    "apt cache": (True, "packages apt fetches again"),
    "old pack exports": (True, "the miner exports its pack again"),
    "recovery snapshots": (True, "finished exec snapshots"),
    "releases": (False, "the running, previous and wanted releases"),
    "logs": (False, "current logs and those within the rotation window"),
    "job outputs": (False, "read back by the operator before the box goes"),
    "pack": (False, "the miner's current pack"),
    "models": (False, "models"),
    "snapshots in use": (False, "a recovery runs now, or its state cannot be read"),
    "toolchain cache in use": (False, "a job runs now, or a job's state cannot be read"),
    "fleet files": (False, "the agent, its environment, the node's data and the rest"),
}


class Classifier(Protocol):
    """What a review and a clean ask of the rules: the categories (name -> (regenerable,
    why), in the order a review lists them), the folders to read, and each path's category
    (None: not ours, never touched)."""

    @property
    def root(self) -> Path: ...

    @property
    def categories(self) -> dict[str, tuple[bool, str]]: ...

    def tops(self) -> list[Path]: ...

    def now(self) -> Classifier:
        """The rules as the files say now (a switch may have moved the pointer meanwhile)."""
        ...

    def category(self, path: Path) -> str | None: ...

    def keeps(self, path: Path) -> bool:
        """A folder the clean never removes, even emptied."""
        ...


@dataclass(frozen=True)
class Rules:
    """The categories of one box's files, from what the agent wrote."""

    root: Path
    log_keep: int
    kept_releases: frozenset[str]  # release directory names
    recovery_running: bool
    jobs_active: bool
    caches: tuple[tuple[str, Path], ...]  # (category, directory) outside the root

    @classmethod
    def of(cls, root: Path, log_keep: int, home: Path | None = None,
           apt: Path = Path("/var/cache/apt/archives")) -> Rules:
        home = home if home is not None else Path.home()
        return cls(root, log_keep, kept_releases(root), recovery_running(root), jobs_active(root),
                   (("pip cache", home / ".cache" / "pip"),
                    ("huggingface cache", home / ".cache" / "huggingface"),
                    ("apt cache", apt)))

    def category(self, path: Path) -> str | None:
        """The category of `path` (a file, link or directory), or None when it is neither
        under the root nor under a cache: not the fleet's, never touched."""
        for name, cache in self.caches:
            if path == cache:
                return None  # the cache's own folder (or a link to one) is not ours to delete
            if _under(path, cache):
                if name == "apt cache" and not (path.suffix == ".deb" or
                                                path.parent.name == "partial"):
                    return None  # apt's lock and the rest: apt's own
                return name
        if not _under(path, self.root):
            return None
        parts = path.relative_to(self.root).parts
        if not parts:
            return "fleet files"
        top = parts[0]
        if top == RELEASES and len(parts) > 1:
            return "releases" if parts[1] in self.kept_releases else "old releases"
        if top in (LOGS, OUT) and len(parts) == 2:
            m = ROTATED.match(parts[1])
            if m and int(m["n"]) > self.log_keep:
                return "rotated logs"
            return "logs" if top == LOGS or m or parts[1].endswith(".log") else "fleet files"
        if top == JOBS:
            return "job outputs"
        if top == "pack":
            return "pack"
        if top.startswith("pack.") and top != "pack.json":
            return "old pack exports"
        if top == "models":
            return "models"
        if top == "cache" and len(parts) > 1:
            return "toolchain cache in use" if self.jobs_active else "huggingface cache"
        if top == "snapshots" and len(parts) > 1:
            return "snapshots in use" if self.recovery_running else "recovery snapshots"
        return "fleet files"

    @property
    def categories(self) -> dict[str, tuple[bool, str]]:
        return CATEGORIES

    def tops(self) -> list[Path]:
        return [self.root] + [d for _, d in self.caches]

    def now(self) -> Rules:
        return replace(self, kept_releases=kept_releases(self.root),
                       recovery_running=recovery_running(self.root),
                       jobs_active=jobs_active(self.root))

    def keeps(self, path: Path) -> bool:
        return path in {c for _, c in self.caches} or path == self.root / RELEASES


def _under(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def kept_releases(root: Path) -> frozenset[str]:
    """The release directories a cleanup never deletes: those the pointer, agent.toml, the
    previous-release record or the node binary the agent recorded running names, and, where
    no previous release is recorded, the newest other one. No pointer, or a file that cannot
    be read, keeps every release (nothing can be told)."""
    names: set[str] = set()
    try:
        dirs = [d for d in (root / RELEASES).iterdir() if d.is_dir()]
    except OSError:
        return frozenset()
    every = frozenset(d.name for d in dirs)
    texts = []
    for f in (POINTER, CONFIG, POINTER_PREVIOUS, f"{RUN}/state.json"):
        try:
            texts.append((root / f).read_text(errors="replace"))
        except FileNotFoundError:
            texts.append("")
        except OSError:
            return every
    if not texts[0].strip():
        return every  # no pointer: the node runs what the agent adopted, or nothing is known
    try:  # what the node runs now, as the agent recorded it (a pointer may be pending)
        state = json.loads(texts[3]) if texts[3].strip() else {}
        texts[3] = json.dumps(state.get("node_binary"))
    except (ValueError, AttributeError):
        return every
    for d in dirs:
        if any(f"{RELEASES}/{d.name}" in t for t in texts):
            names.add(d.name)
    if not texts[2].strip():  # no previous recorded: the newest of the others stands for it
        others = sorted((d for d in dirs if d.name not in names),
                        key=lambda d: d.stat().st_mtime, reverse=True)
        names.update(d.name for d in others[:1])
    return frozenset(names)


def recovery_running(root: Path) -> bool:
    """Whether a recovery runs now, by the agent's state; True when the state cannot be read."""
    try:
        state = json.loads((root / RUN / "state.json").read_text())
        return (state.get("recovery") or {}).get("state") == "running"
    except FileNotFoundError:
        return False
    except (OSError, ValueError, AttributeError):
        return True


def jobs_active(root: Path) -> bool:
    """Whether a job on the box has not ended (its toolchain is in the cache); True when a
    job's state cannot be read."""
    try:
        jobs = [d for d in (root / JOBS).iterdir() if d.is_dir()]
    except FileNotFoundError:
        return False
    except OSError:
        return True
    for d in jobs:
        try:
            phase = json.loads((d / JOB_STATE).read_text()).get("phase")
        except FileNotFoundError:
            continue  # a job folder with no state yet: nothing of it was fetched
        except (OSError, ValueError, AttributeError):
            return True
        if phase not in TERMINAL:
            return True
    return False


@dataclass
class Category:
    name: str
    bytes: int = 0  # allocated: what deleting it frees
    files: int = 0
    oldest: float | None = None  # mtime
    paths: list[list[Any]] = field(default_factory=list)  # [path, size, mtime_ns, bytes]

    def add(self, path: Path, st: os.stat_result, keep_paths: bool) -> None:
        alloc = st.st_blocks * 512
        self.bytes += alloc
        self.files += 1
        self.oldest = st.st_mtime if self.oldest is None else min(self.oldest, st.st_mtime)
        if keep_paths:
            self.paths.append([str(path), st.st_size, st.st_mtime_ns, alloc])


def walk(top: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every file and link under `top` (never following a link, never crossing into another
    filesystem mounted below it), with its lstat."""
    try:
        st = top.lstat()
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        return  # a folder that is a link leads somewhere the rules never looked
    if not stat.S_ISDIR(st.st_mode):
        yield top, st
        return
    for base, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = [d for d in dirs if _same_device(os.path.join(base, d), st.st_dev)]
        for name in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            p = Path(base, name)
            try:
                yield p, p.lstat()
            except OSError:
                continue


def _same_device(path: str, dev: int) -> bool:
    try:
        return os.lstat(path).st_dev == dev
    except OSError:
        return False


def disk(root: Path) -> dict[str, int | None]:
    try:
        st = os.statvfs(root)
    except OSError:
        return {"total_bytes": None, "free_bytes": None}
    return {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}


def review(rules: Classifier) -> dict[str, Any]:
    """Every category with its size, file count and oldest file; the regenerable ones with
    each file (path, size, mtime_ns, allocated bytes) for a clean to check. Reads only."""
    table = rules.categories
    cats: dict[str, Category] = {}
    for top in rules.tops():
        for path, st in walk(top):
            name = rules.category(path)
            if name is None:
                continue
            cat = cats.setdefault(name, Category(name))
            cat.add(path, st, table[name][0])
    space = disk(rules.root)
    freeable = sum(c.bytes for c in cats.values() if table[c.name][0])
    out = []
    for name, (regen, why) in table.items():
        c = cats.get(name)
        if c is None:
            continue
        out.append({"name": name, "regenerable": regen, "why": why, "bytes": c.bytes,
                    "files": c.files, "oldest": c.oldest, "paths": c.paths})
    free = space["free_bytes"]
    return {"root": str(rules.root), "disk": space, "categories": out,
            "freeable_bytes": freeable,
            "free_after_bytes": None if free is None else free + freeable}


def clean(rules: Classifier, reviewed: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    """Delete what the review `reviewed` listed as regenerable, file by file, only where the
    rules still call it regenerable (else refused) and it still has the size and mtime the
    review recorded (else skipped). Empty directories it leaves under a regenerable path
    go too. Returns what was freed per category against what the review promised."""
    problem = invalid(reviewed)
    if problem:
        raise ValueError(f"not a storage review: {problem}")
    done: dict[str, dict[str, int]] = {}
    skipped: list[dict[str, str]] = []
    refused: list[dict[str, str]] = []
    emptied: set[Path] = set()
    before = disk(rules.root)["free_bytes"]
    for cat in reviewed["categories"]:
        name = str(cat.get("name"))
        tally = done.setdefault(name, {"promised": cat["bytes"] if cat.get("regenerable")
                                       else 0, "freed": 0, "files": 0})
        for entry in cat["paths"]:
            path, size, mtime_ns = Path(entry[0]), entry[1], entry[2]
            crooked = _crooked(entry[0])
            if crooked:
                refused.append({"path": entry[0], "why": f"preserved ({crooked})"})
                continue
            now = rules.now().category(path)  # read again: a switch may have landed
            if now is None or not rules.categories[now][0]:
                why = "not the fleet's" if now is None else f"{now}: {rules.categories[now][1]}"
                refused.append({"path": str(path), "why": f"preserved ({why})"})
                continue
            try:
                st = path.lstat()
            except FileNotFoundError:
                skipped.append({"path": str(path), "why": "gone since the review"})
                continue
            if stat.S_ISDIR(st.st_mode) or (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                skipped.append({"path": str(path), "why": "changed since the review"})
                continue
            if not dry_run:
                try:
                    path.unlink()
                except OSError as e:
                    skipped.append({"path": str(path), "why": f"cannot delete: {e.strerror}"})
                    continue
                emptied.add(path.parent)
            tally["freed"] += st.st_blocks * 512
            tally["files"] += 1
    for d in sorted(emptied, key=lambda p: len(p.parts), reverse=True):
        _prune(d, rules)
    return {"dry_run": dry_run, "categories": done, "skipped": skipped, "refused": refused,
            "free_before_bytes": before, "free_after_bytes": disk(rules.root)["free_bytes"]}


def invalid(reviewed: Any) -> str | None:
    """Why `reviewed` is not a review a clean can act on (checked whole, before anything is
    deleted), or None."""
    if not isinstance(reviewed, dict) or not isinstance(reviewed.get("categories"), list):
        return "no list of categories"
    for cat in reviewed["categories"]:
        if not isinstance(cat, dict) or not isinstance(cat.get("paths", []), list):
            return "a category that is not an object with a list of paths"
        cat.setdefault("paths", [])
        if not _count(cat.get("bytes", 0)):
            return f"category {str(cat.get('name'))[:40]!r}: bytes is not a count"
        cat.setdefault("bytes", 0)
        for p in cat["paths"]:
            if not (isinstance(p, list) and len(p) >= 3 and isinstance(p[0], str)
                    and "\0" not in p[0] and _count(p[1]) and _count(p[2])):
                return "a path that is not [path, size, mtime_ns, ...]"
    return None


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _crooked(text: str) -> str | None:
    """Why a reviewed path is not one the clean may follow: not absolute, not normal (`..`,
    `.`, doubled or trailing slashes), or through a link (its folder is not where it says)."""
    if not os.path.isabs(text) or os.path.normpath(text) != text or text.startswith("//"):
        return "not a plain absolute path"
    parent = os.path.dirname(text)
    if os.path.realpath(parent) != parent:
        return "its folder is reached through a link"
    return None


def _prune(d: Path, rules: Classifier) -> None:
    """Remove `d` and its parents while they are empty and regenerable (never a folder the
    rules keep: a cache's or the releases' own top)."""
    while not rules.keeps(d) and (name := rules.category(d)) is not None \
            and rules.categories[name][0]:
        try:
            d.rmdir()
        except OSError:
            return
        d = d.parent
