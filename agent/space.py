"""What fills a box, by what the agent knows it wrote, and what a cleanup may delete: part of
the agent's contract (it imports nothing but agent.contract), so the operator's side reviews
its own files (`fleet.ops.storage`) with the same review and clean.

The rules live here once: the review (`python -m agent storage`) and the clean (`python -m
agent storage clean`) ask the same `category` of every path, so a clean never deletes what
the rules keep, whatever a review file says. A box's rules (`Rules`), regenerable:

- releases/<d>: a release no pointer, agent.toml, previous-release record or staging record
  names (the previous release is the one `agent switch` recorded moving away from; with no
  record of the switch that wrote the pointer, every release is kept, never a guess);
- rotated logs numbered beyond the rotation window (`log_keep`): `<log>.<n>`, n > log_keep;
- pip, Hugging Face and apt caches (~/.cache/pip, ~/.cache/huggingface, apt's archives), and
  the agent's own toolchain cache (cache/: the Hub's downloads) while no job runs;
- old pack exports: the pack directory's siblings `pack.*` (the pack itself is kept);
- finished recovery snapshots: snapshots/*, unless a recovery runs now (or the state cannot
  be read: then they are kept).

Fail closed: the rules are read once per clean, and again only where a file they come from
changed; anything of them that cannot be read (a FIFO, a file that is not one, no descriptor
left) keeps every file for the rest of the clean. Nothing is deleted across a mount, and only
inodes actually freed count as freed (a hard link to a kept file frees nothing).

Kept: the running, previous, staged and wanted releases, current logs and those within the window,
jobs/ (outputs the operator reads back), the miner's pack, models/, everything else under the
root, and anything outside it that the fleet did not write (never scanned).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
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
    RELEASES_STAGED,
    RUN,
    TERMINAL,
)

PARTIAL = ".partial"  # a release being unpacked (operations/release.py)
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

    @property
    def problem(self) -> str | None:
        """What of the rules could not be read (then the clean keeps everything)."""
        ...

    def category(self, path: Path) -> str | None: ...

    def keeps(self, path: Path) -> bool:
        """A folder the clean never removes, even emptied."""
        ...


@dataclass(frozen=True)
class Rules:
    """The categories of one box's files, from what the agent wrote, read once (`of`) and
    again only when one of the files they come from changed (`now`)."""

    root: Path
    log_keep: int
    kept_releases: frozenset[str] | None  # release directory names; None: every release
    recovery_running: bool
    jobs_active: bool
    caches: tuple[tuple[str, Path], ...]  # (category, directory) outside the root
    keep: frozenset[str] = frozenset()  # releases the operator wants kept (its wanted one)
    problem: str | None = None  # what of the rules could not be read: then everything is kept
    signature: tuple[Any, ...] = ()

    @classmethod
    def of(cls, root: Path, log_keep: int, home: Path | None = None,
           apt: Path = Path("/var/cache/apt/archives"), keep: frozenset[str] = frozenset()
           ) -> Rules:
        home = home if home is not None else Path.home()
        caches = (("pip cache", home / ".cache" / "pip"),
                  ("huggingface cache", home / ".cache" / "huggingface"), ("apt cache", apt))
        return cls(root, log_keep, None, True, True, caches, keep)._read()

    def _read(self) -> Rules:
        signature = inputs_signature(self.root)  # first: a change while reading shows next time
        problems = []
        kept, why = read_kept_releases(self.root, self.keep)
        if why:
            problems.append(why)
        running, why = read_recovery_running(self.root)
        if why:
            problems.append(why)
        active, why = read_jobs_active(self.root)
        if why:
            problems.append(why)
        return replace(self, kept_releases=None if problems else kept,
                       recovery_running=running or bool(problems),
                       jobs_active=active or bool(problems),
                       problem="; ".join(problems) or None, signature=signature)

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
            name = parts[1].removesuffix(PARTIAL)  # a release's unpack goes with it
            kept = self.kept_releases is None or name in self.kept_releases
            return "releases" if kept else "old releases"
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
        """The rules as the files say now: read again only where one of them changed (a
        pointer written by a deploy, a publish's staging, a job or a recovery starting)."""
        if self.problem is None and inputs_signature(self.root) == self.signature:
            return self
        return self._read()

    def keeps(self, path: Path) -> bool:
        return path in {c for _, c in self.caches} or path == self.root / RELEASES


def _under(path: Path, top: Path) -> bool:
    """Whether `path` is `top` or below it (both absolute and normal: compared as text, a
    clean asks this of every file)."""
    p, t = str(path), str(top).rstrip("/")
    return p == t or p.startswith(t + "/") or t == ""


# what the rules are read from; a changed file (replaced by rename, or written in place) or
# folder (a job, a staged release added) changes its lstat
INPUTS = (POINTER, CONFIG, POINTER_PREVIOUS, f"{RUN}/state.json", RELEASES_STAGED, JOBS)


def inputs_signature(root: Path) -> tuple[Any, ...]:
    sig: list[Any] = []
    for name in INPUTS:
        try:
            st = os.lstat(f"{root}/{name}")
        except FileNotFoundError:
            sig.append(None)
        except OSError as e:
            sig.append(("error", e.errno, time.monotonic_ns()))  # never equal: read again
        else:
            sig.append((st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size))
    return tuple(sig)


MAX_RULE_BYTES = 1 << 20


def read_rule_file(path: Path) -> str:
    """A rule file's text, "" when absent; OSError when it cannot be read or is not a regular
    file (opened non-blocking: a FIFO in its place cannot hang the review or the clean)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RULE_BYTES:
            raise OSError(errno.EINVAL, "not a regular file of a sane size", str(path))
        return os.read(fd, MAX_RULE_BYTES + 1).decode(errors="replace")
    finally:
        os.close(fd)


RELEASE_NAME = re.compile(rf"{RELEASES}/([^/\s\"']+)")


def previous_record(text: str) -> dict[str, str] | None:
    """The previous-release record `agent switch` writes (agent/base/releases_record.py):
    where the pointer was (`previous`) and where the switch led it (`to`); None when it is
    not one (an older record that does not say where it led)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str)
                                            for k in ("previous", "to")):
        return None
    return doc


def read_kept_releases(root: Path, keep: frozenset[str] = frozenset()
                       ) -> tuple[frozenset[str] | None, str | None]:
    """The release directories a cleanup never deletes, or (None, why) where that cannot be
    told (then every release is kept): those the pointer, agent.toml, the node binary the
    agent recorded running, the previous-release record or a staging record names, and those
    in `keep`. No pointer, or no record of the switch that wrote it, keeps every release."""
    try:
        pointer, config, recorded, state = (read_rule_file(root / f) for f in (
            POINTER, CONFIG, POINTER_PREVIOUS, f"{RUN}/state.json"))
        pointer_st = os.lstat(root / POINTER) if pointer.strip() else None
        staged = _staged_since(root, pointer_st.st_mtime_ns) if pointer_st else set()
    except OSError as e:
        return None, f"the release rules cannot be read: {e.strerror or e}"
    if pointer_st is None:
        return None, None  # no pointer: the node runs what the agent adopted, or nothing
    record = previous_record(recorded)
    if record is None or record["to"] != pointer.strip():
        return None, None  # switched before the record, or since by other means: keep all
    try:  # what the node runs now, as the agent recorded it (a pointer may be pending)
        node_binary = json.dumps((json.loads(state) if state.strip() else {}).get("node_binary"))
    except (ValueError, AttributeError):
        return None, "the agent's state cannot be read"
    names = set(keep) | staged
    for text in (pointer, config, record["previous"], node_binary):
        names.update(RELEASE_NAME.findall(text))
    return frozenset(names), None


def _staged_since(root: Path, pointer_ns: int) -> set[str]:
    """The releases a publish staged since the pointer was last written: each waits for its
    switch (release.present writes the record, by rename)."""
    try:
        entries = list(os.scandir(root / RELEASES_STAGED))
    except FileNotFoundError:
        return set()
    return {e.name for e in entries if e.stat(follow_symlinks=False).st_mtime_ns >= pointer_ns}


def kept_releases(root: Path, keep: frozenset[str] = frozenset()) -> frozenset[str] | None:
    """The releases a cleanup keeps; None: every one."""
    return read_kept_releases(root, keep)[0]


def read_recovery_running(root: Path) -> tuple[bool, str | None]:
    """Whether a recovery runs now, by the agent's state; (True, why) when it cannot be read."""
    try:
        text = read_rule_file(root / RUN / "state.json")
        state = json.loads(text) if text.strip() else {}
        return (state.get("recovery") or {}).get("state") == "running", None
    except OSError as e:
        return True, f"the agent's state cannot be read: {e.strerror or e}"
    except (ValueError, AttributeError):
        return True, "the agent's state cannot be read"


def read_jobs_active(root: Path) -> tuple[bool, str | None]:
    """Whether a job on the box has not ended (its toolchain is in the cache); (True, why)
    when a job's state cannot be read."""
    try:
        jobs = [d for d in os.scandir(root / JOBS) if d.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return False, None
    except OSError as e:
        return True, f"the jobs cannot be read: {e.strerror or e}"
    for d in jobs:
        try:
            text = read_rule_file(Path(d.path) / JOB_STATE)
            phase = json.loads(text).get("phase") if text.strip() else None
        except OSError as e:
            return True, f"job {d.name}'s state cannot be read: {e.strerror or e}"
        except (ValueError, AttributeError):
            return True, f"job {d.name}'s state cannot be read"
        if phase is not None and phase not in TERMINAL:  # no state yet: nothing fetched
            return True, None
    return False, None


@dataclass
class Category:
    name: str
    bytes: int = 0  # allocated: what deleting it frees
    files: int = 0
    oldest: float | None = None  # mtime
    paths: list[list[Any]] = field(default_factory=list)  # [path, size, mtime_ns, bytes]

    def add(self, path: Path, st: os.stat_result, keep_paths: bool, freed: int) -> None:
        alloc = st.st_blocks * 512
        self.bytes += freed
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
    links: dict[tuple[int, int, str], int] = {}  # inode, category -> links seen
    for top in rules.tops():
        for path, st in walk(top):
            name = rules.category(path)
            if name is None:
                continue
            cat = cats.setdefault(name, Category(name))
            cat.add(path, st, table[name][0], _frees(st, links, name))
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
            "freeable_bytes": freeable, "rules_problem": rules.problem,
            "free_after_bytes": None if free is None else free + freeable}


def _frees(st: os.stat_result, links: dict[tuple[int, int, str], int], category: str) -> int:
    """What deleting this link frees: its blocks once every link of its inode was seen in
    the same category (a hard link to a kept file frees nothing)."""
    if st.st_nlink <= 1:
        return st.st_blocks * 512
    key = (st.st_dev, st.st_ino, category)
    seen = links[key] = links.get(key, 0) + 1
    return st.st_blocks * 512 if seen == st.st_nlink else 0


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
    links: dict[tuple[int, int, str], int] = {}
    before = disk(rules.root)["free_bytes"]
    try:
        mounts = mounts_below(rules.tops())
        failed = rules.problem
    except OSError as e:
        mounts, failed = [], f"the mounts cannot be read: {e.strerror or e}"
    for cat in reviewed["categories"]:
        name = str(cat.get("name"))
        tally = done.setdefault(name, {"promised": cat["bytes"] if cat.get("regenerable")
                                       else 0, "freed": 0, "files": 0})
        for entry in cat["paths"]:
            path, size, mtime_ns = Path(entry[0]), entry[1], entry[2]
            if failed is None:
                rules = rules.now()  # read again where a file it comes from changed
                failed = rules.problem
            if failed is not None:  # once anything of the rules could not be read: keep all
                refused.append({"path": entry[0], "why": f"preserved (the rules cannot be "
                                f"read: {failed})"})
                continue
            crooked = _crooked(entry[0]) or _mounted(path, mounts)
            if crooked:
                refused.append({"path": entry[0], "why": f"preserved ({crooked})"})
                continue
            now = rules.category(path)
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
            # another link keeps the inode: only the last one unlinked frees it
            tally["freed"] += _frees(st, links, "") if dry_run else \
                st.st_blocks * 512 if st.st_nlink <= 1 else 0
            tally["files"] += 1
    if failed is None:
        for d in sorted(emptied, key=lambda p: len(p.parts), reverse=True):
            _prune(d, rules)
    return {"dry_run": dry_run, "categories": done, "skipped": skipped, "refused": refused,
            "free_before_bytes": before, "free_after_bytes": disk(rules.root)["free_bytes"]}


def mounts_below(tops: list[Path], mountinfo: str = "/proc/self/mountinfo") -> list[Path]:
    """The mount points strictly below any of `tops` (a bind mount of the same filesystem
    included, which st_dev cannot tell); OSError when the mounts cannot be read."""
    with open(mountinfo, "rb") as f:
        text = f.read()
    points = []
    for line in text.splitlines():
        fields = line.split(b" ")
        if len(fields) < 5:
            continue
        point = Path(os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]),
                                        fields[4])))
        if any(top in point.parents for top in tops):
            points.append(point)
    return points


def _mounted(path: Path, mounts: list[Path]) -> str | None:
    """Why `path` lies across a mount: below a mount point under its top. (Not by st_dev: on
    overlayfs, a container's root, a file's st_dev is its layer's, not its folder's.)"""
    return "across a mount" if any(_under(path, m) for m in mounts) else None


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
