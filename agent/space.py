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
import tomllib
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
    jobs: tuple[str, ...] = ()  # the job folders the signature covers

    @classmethod
    def of(cls, root: Path, log_keep: int, home: Path | None = None,
           apt: Path = Path("/var/cache/apt/archives"), keep: frozenset[str] = frozenset()
           ) -> Rules:
        home = home if home is not None else Path.home()
        caches = (("pip cache", home / ".cache" / "pip"),
                  ("huggingface cache", home / ".cache" / "huggingface"), ("apt cache", apt))
        return cls(root, log_keep, None, True, True, caches, keep)._read()

    def _read(self) -> Rules:
        jobs = job_names(self.root)
        signature = inputs_signature(self.root, jobs)  # first: a change while reading shows
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
                       problem="; ".join(problems) or None, signature=signature, jobs=jobs)

    def category(self, path: Path) -> str | None:
        """The category of `path` (a file, link or directory), or None when it is neither
        under the root nor under a cache: not the fleet's, never touched."""
        for name, cache in self.caches:
            if _under(path, cache):
                return _cache_category(name, cache, path)
        if not _under(path, self.root):
            return None
        return self._root_category(path.relative_to(self.root).parts)

    def _root_category(self, parts: tuple[str, ...]) -> str:
        """The category of the path `parts` under the root."""
        if not parts:
            return "fleet files"
        top, inner = parts[0], len(parts) > 1
        if top == RELEASES and inner:
            name = parts[1].removesuffix(PARTIAL)  # a release's unpack goes with it
            kept = self.kept_releases is None or name in self.kept_releases
            return "releases" if kept else "old releases"
        if top in (LOGS, OUT) and len(parts) == 2:
            m = ROTATED.match(parts[1])
            if m and int(m["n"]) > self.log_keep:
                return "rotated logs"
            return "logs" if top == LOGS or m or parts[1].endswith(".log") else "fleet files"
        if inner and top == "cache":
            return "toolchain cache in use" if self.jobs_active else "huggingface cache"
        if inner and top == "snapshots":
            return "snapshots in use" if self.recovery_running else "recovery snapshots"
        return _top_category(top)

    @property
    def categories(self) -> dict[str, tuple[bool, str]]:
        return CATEGORIES

    def tops(self) -> list[Path]:
        return [self.root] + [d for _, d in self.caches]

    def now(self) -> Rules:
        """The rules as the files say now: read again only where one of them changed (a
        pointer written by a deploy, a publish's staging, a job or a recovery starting)."""
        if self.problem is None and inputs_signature(self.root, self.jobs) == self.signature:
            return self
        return self._read()

    def keeps(self, path: Path) -> bool:
        return path in {c for _, c in self.caches} or path == self.root / RELEASES


def _cache_category(name: str, cache: Path, path: Path) -> str | None:
    """The category of `path`, under the cache `name` at `cache`."""
    if path == cache:
        return None  # the cache's own folder (or a link to one) is not ours to delete
    if name == "apt cache" and not (path.suffix == ".deb" or path.parent.name == "partial"):
        return None  # apt's lock and the rest: apt's own
    return name


# the root's top folders that are one category whole
TOPS = {JOBS: "job outputs", "pack": "pack", "models": "models"}


def _top_category(top: str) -> str:
    """The category of what lies in (or is) the root's top folder or file `top`, where its
    name alone says it."""
    if top in TOPS:
        return TOPS[top]
    if top.startswith("pack.") and top != "pack.json":
        return "old pack exports"
    return "fleet files"


def _under(path: Path, top: Path) -> bool:
    """Whether `path` is `top` or below it (both absolute and normal: compared as text, a
    clean asks this of every file)."""
    p, t = str(path), str(top).rstrip("/")
    return p == t or p.startswith(t + "/") or t == ""


# what the rules are read from; a changed file (replaced by rename, or written in place) or
# folder (a job, a staged release added) changes its lstat; and each job's folder and state
INPUTS = (POINTER, CONFIG, POINTER_PREVIOUS, f"{RUN}/state.json", RELEASES_STAGED, JOBS)


def job_names(root: Path) -> tuple[str, ...]:
    """The job folders' names (an unreadable jobs/ reads as none: read_jobs_active says why)."""
    try:
        return tuple(sorted(d.name for d in os.scandir(root / JOBS)
                            if d.is_dir(follow_symlinks=False)))
    except OSError:
        return ()


def inputs_signature(root: Path, jobs: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """The lstat of each file the rules come from: INPUTS, and each of `jobs` (a folder
    added to jobs/ changes its lstat; a state written there, by rename or in place, its
    folder's or its own)."""
    sig: list[Any] = []
    names = [*INPUTS, *(f"{JOBS}/{j}{s}" for j in jobs for s in ("", f"/{JOB_STATE}"))]
    for name in names:
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


def read_regular(path: Path, follow: bool = False) -> bytes:
    """A regular file's bytes, opened non-blocking (a FIFO in its place cannot hang the
    reader); FileNotFoundError when absent, OSError when it cannot be read or is not a
    regular file of a sane size (a link too, unless `follow`)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RULE_BYTES:
            raise OSError(errno.EINVAL, "not a regular file of a sane size", str(path))
        return os.read(fd, MAX_RULE_BYTES + 1)
    finally:
        os.close(fd)


def read_rule_file(path: Path) -> str:
    """A rule file's text, "" when absent; OSError when it cannot be read or is not a regular
    file (`read_regular`)."""
    try:
        return read_regular(path).decode(errors="replace")
    except FileNotFoundError:
        return ""


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


class Unresolved(ValueError):
    """A named path that leads to no single release folder: every release is kept."""


def release_names(text: str, root: Path, strict: bool = True) -> set[str]:
    """The release folders the path `text` (relative ones from the root) names: the one it
    is spelled in and the one it lies in after every link. Unresolved where that cannot be
    told: the releases' own folder, a placeholder, or (`strict`: a binary is named) a path
    that leads out of the releases to anything but a regular file."""
    if "\0" in text or "{" in text:
        raise Unresolved(text)
    releases = f"{root}/{RELEASES}"
    spelled = _release_in(os.path.normpath(os.path.join(root, text)), releases)
    real = os.path.realpath(os.path.join(root, text))
    lies = _release_in(real, os.path.realpath(releases))
    if "" in (spelled, lies):
        raise Unresolved(text)
    names = {n for n in (spelled, lies) if n is not None}
    if lies is None and strict:
        try:
            regular = stat.S_ISREG(os.stat(real).st_mode)
        except OSError:
            regular = False
        if not regular:
            raise Unresolved(text)
    return names


def _release_in(path: str, releases: str) -> str | None:
    """The release folder `path` lies in, "" when it is the releases' folder itself, None
    when it lies outside them."""
    if path == releases:
        return ""
    if not path.startswith(releases + "/"):
        return None
    return path[len(releases) + 1:].split("/", 1)[0].removesuffix(PARTIAL)


def _config_paths(doc: Any, root: Path) -> Iterator[str]:
    """The paths agent.toml's values spell (`{root}` filled in): each absolute word, and each
    that names the releases (`--data=...` split at its `=`)."""
    if isinstance(doc, dict):
        doc = list(doc.values())
    if isinstance(doc, list):
        for v in doc:
            yield from _config_paths(v, root)
    elif isinstance(doc, str):
        for word in re.split(r"[\s=:,]+", doc.replace("{root}", str(root))):
            if word.startswith("/") or re.search(rf"(^|/){RELEASES}(/|$)", word):
                yield word


def read_kept_releases(root: Path, keep: frozenset[str] = frozenset()
                       ) -> tuple[frozenset[str] | None, str | None]:
    """The release directories a cleanup never deletes, or (None, why) where that cannot be
    told (then every release is kept): those the pointer, agent.toml, the node binary the
    agent recorded running or the previous-release record names (each resolved to the folder
    it lies in), every one staged by a publish, and those in `keep`. No pointer, no record of
    the switch that wrote it, or a named path that leads to no single release keeps every
    release."""
    try:
        pointer, config, recorded, state = (read_rule_file(root / f) for f in (
            POINTER, CONFIG, POINTER_PREVIOUS, f"{RUN}/state.json"))
        staged = _staged(root)
    except OSError as e:
        return None, f"the release rules cannot be read: {e.strerror or e}"
    target = pointer.strip()
    if not target:
        return None, None  # no pointer: the node runs what the agent adopted, or nothing
    record = previous_record(recorded)
    if record is None or record["to"] != target:
        return None, None  # switched before the record, or since by other means: keep all
    try:  # what the node runs now, as the agent recorded it (a pointer may be pending)
        node = (json.loads(state) if state.strip() else {}).get("node_binary")
        binaries = [] if node is None else [node["path"]]
    except (ValueError, AttributeError, TypeError, KeyError):
        return None, "the agent's state cannot be read"
    if not all(isinstance(b, str) for b in binaries):
        return None, "the agent's state cannot be read"
    try:
        settings = tomllib.loads(config)
    except tomllib.TOMLDecodeError:
        return None, "agent.toml cannot be read"
    names = set(keep) | staged
    try:
        for path in (target, record["previous"], *binaries):
            names |= release_names(path, root)
        for path in _config_paths(settings, root):
            names |= release_names(path, root, strict=False)
    except Unresolved:
        return None, None
    return frozenset(names), None


def _staged(root: Path) -> set[str]:
    """The releases a publish staged (release.present writes the record, by rename): each is
    kept until a switch points at it (releases_record.record removes it) or the operator
    removes the record."""
    try:
        return set(os.listdir(root / RELEASES_STAGED))
    except FileNotFoundError:
        return set()


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
    rules still call it regenerable (else refused), its folder lies on the mount of its top
    reached through no link (else refused), and it still has the size and mtime the review
    recorded (else skipped). Empty directories it leaves under a regenerable path go too.
    Returns what was freed per category against what the review promised."""
    problem = invalid(reviewed)
    if problem:
        raise ValueError(f"not a storage review: {problem}")
    before = disk(rules.root)["free_bytes"]
    run = _Cleaning(rules, dry_run, Folders(rules.tops()), rules.problem)
    try:
        for cat in reviewed["categories"]:
            name = str(cat.get("name"))
            tally = run.done.setdefault(name, {"promised": cat["bytes"] if cat.get("regenerable")
                                               else 0, "freed": 0, "files": 0})
            for entry in cat["paths"]:
                run.delete(entry, tally)
    finally:
        run.folders.close()
    if run.failed is None:
        for d in sorted(run.emptied, key=lambda p: len(p.parts), reverse=True):
            _prune(d, run.rules)
    return {"dry_run": dry_run, "categories": run.done, "skipped": run.skipped,
            "refused": run.refused, "free_before_bytes": before,
            "free_after_bytes": disk(run.rules.root)["free_bytes"]}


@dataclass
class _Cleaning:
    """One clean under way: the rules as last read, what it did so far."""

    rules: Classifier
    dry_run: bool
    folders: Folders
    failed: str | None  # what of the rules could not be read: then nothing more is deleted
    done: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)
    emptied: set[Path] = field(default_factory=set)
    links: dict[tuple[int, int, str], int] = field(default_factory=dict)

    def delete(self, entry: list[Any], tally: dict[str, int]) -> None:
        """Delete the reviewed file `entry` ([path, size, mtime_ns, ...]) where the rules and
        its folder allow and it is unchanged; count it in `tally`."""
        path, size, mtime_ns = Path(entry[0]), entry[1], entry[2]
        if self.failed is None:
            self.rules = self.rules.now()  # read again where a file it comes from changed
            self.failed = self.rules.problem
        if self.failed is not None:  # once anything of the rules could not be read
            self.refused.append({"path": entry[0], "why": f"preserved (the rules cannot "
                                 f"be read: {self.failed})"})
            return
        folder: int | str = _crooked(entry[0]) or _kept(self.rules, path) or \
            self.folders.open(os.path.dirname(entry[0]))
        if isinstance(folder, str):
            self.refused.append({"path": entry[0], "why": f"preserved ({folder})"})
            return
        st = self._unchanged(path, folder, size, mtime_ns)
        if st is None:
            return
        if not self.dry_run:
            try:  # from the folder checked: a mount or swap since cannot redirect it
                os.unlink(path.name, dir_fd=folder)
            except OSError as e:
                self.skipped.append({"path": str(path), "why": f"cannot delete: {e.strerror}"})
                return
            self.emptied.add(path.parent)
        # another link keeps the inode: only the last one unlinked frees it
        tally["freed"] += _frees(st, self.links, "") if self.dry_run else \
            st.st_blocks * 512 if st.st_nlink <= 1 else 0
        tally["files"] += 1

    def _unchanged(self, path: Path, folder: int, size: int, mtime_ns: int
                   ) -> os.stat_result | None:
        """The file's lstat in its checked folder, or None (and why, in skipped) when it is
        gone, unreadable, a folder, or changed since the review."""
        try:
            st = os.lstat(path.name, dir_fd=folder)
        except FileNotFoundError:
            self.skipped.append({"path": str(path), "why": "gone since the review"})
            return None
        except OSError as e:
            self.skipped.append({"path": str(path), "why": f"cannot be read: {e.strerror}"})
            return None
        if stat.S_ISDIR(st.st_mode) or (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
            self.skipped.append({"path": str(path), "why": "changed since the review"})
            return None
        return st


class Folders:
    """The folders a clean deletes from, each checked once while it stays the same folder
    (its lstat's device and inode): opened from its top one component at a time, never
    through a link, and on the top's own mount (by the mount id the kernel gives the opened
    folder: on overlayfs a file's st_dev is its layer's, and a bind mount of the same
    filesystem has the same st_dev). Files are then unlinked relative to that opened folder.
    Anything that cannot be checked keeps the file."""

    FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    HELD = 64  # folders kept open; a review lists files folder by folder

    def __init__(self, tops: list[Path]) -> None:
        self.tops = sorted((str(t).rstrip("/") or "/" for t in tops), key=len, reverse=True)
        self.held: dict[str, tuple[int, int, int]] = {}  # path -> (fd, dev, ino)
        self.mounts: dict[str, int | str] = {}  # top -> its mount id, or why not

    def open(self, folder: str) -> int | str:
        """An fd of `folder` checked as above, or why it is not one to delete from."""
        top = next((t for t in self.tops if folder == t or folder.startswith(t + "/")
                    or t == "/"), None)
        if top is None:
            return "not the fleet's"
        mount = self.mounts.get(top)
        if mount is None:
            mount = self.mounts[top] = self._top_mount(top)
        if isinstance(mount, str):
            return mount
        try:
            return self._open(folder, top, mount)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                return "its folder is reached through a link"
            return f"its folder cannot be checked: {e.strerror or e}"

    def _top_mount(self, top: str) -> int | str:
        if os.path.realpath(top) != top:
            return "its folder is reached through a link"
        try:
            fd = os.open(top, self.FLAGS)
        except OSError as e:
            return f"its folder cannot be checked: {e.strerror or e}"
        try:
            return mount_id(fd)
        except (OSError, ValueError) as e:
            return f"its mount cannot be told: {e}"
        finally:
            os.close(fd)

    def _open(self, folder: str, top: str, mount: int) -> int | str:
        st = os.lstat(folder)
        held = self.held.get(folder)
        if held is not None:
            if (held[1], held[2]) == (st.st_dev, st.st_ino):
                self.held[folder] = self.held.pop(folder)  # the last used goes last
                return held[0]
            self._drop(folder)
        if folder == top:
            fd = os.open(folder, self.FLAGS)
        else:
            parent = self.open(os.path.dirname(folder))
            if isinstance(parent, str):
                return parent
            fd = os.open(os.path.basename(folder), self.FLAGS, dir_fd=parent)
        try:
            got = os.fstat(fd)
            if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
                raise OSError(errno.ESTALE, "it changed while it was checked")
            if mount_id(fd) != mount:
                os.close(fd)
                return "across a mount"
        except (OSError, ValueError) as e:
            os.close(fd)
            raise OSError(errno.EIO, f"{e}") from None
        if len(self.held) >= self.HELD:
            self._drop(next(iter(self.held)))
        self.held[folder] = (fd, got.st_dev, got.st_ino)
        return fd

    def _drop(self, folder: str) -> None:
        os.close(self.held.pop(folder)[0])

    def close(self) -> None:
        for folder in list(self.held):
            self._drop(folder)


def mount_id(fd: int) -> int:
    """The id of the mount the open file `fd` lies on (/proc/self/fdinfo's `mnt_id`);
    OSError or ValueError when the kernel does not say."""
    with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
        for line in f.read().splitlines():
            if line.startswith(b"mnt_id:"):
                return int(line.split()[1])
    raise ValueError("no mnt_id in /proc/self/fdinfo")


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


def _kept(rules: Classifier, path: Path) -> str | None:
    """Why the rules keep `path` now, or None when they call it regenerable."""
    now = rules.category(path)
    if now is None:
        return "not the fleet's"
    regenerable, why = rules.categories[now]
    return None if regenerable else f"{now}: {why}"


def _crooked(text: str) -> str | None:
    """Why a reviewed path is not one the clean may follow: not absolute, or not normal
    (`..`, `.`, doubled or trailing slashes). Links are Folders' to refuse."""
    if not os.path.isabs(text) or os.path.normpath(text) != text or text.startswith("//"):
        return "not a plain absolute path"
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
