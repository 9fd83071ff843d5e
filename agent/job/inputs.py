"""What the job's work directory may hold where the agent places things in it: the rules the
agent applies at its steps (the toolchain's link at `fetch`, the module globs at `scan`, the
outputs folder at `run`), which the operator applies to the job's inputs folder before it rents
a box (fleet/core/job.py), so that a job the agent would refuse for its inputs rents nothing.
Each returns why not, in one line, or None."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path, PurePosixPath

MAGIC = re.compile(r"[*?[]")


def toolchain_place(work: Path, path: str) -> str | None:
    """Why the toolchain cannot appear at workdir/<path> (a link an earlier fetch made there
    is replaced)."""
    link = work / path
    problem = _parents(work, path, "the toolchain")
    if problem is None and not link.is_symlink() and os.path.lexists(link):
        problem = f"workdir/{path} exists in the job's inputs; the toolchain would hide it"
    return problem


def outputs_place(work: Path, outputs: str) -> str | None:
    """Why the outputs folder cannot be workdir/<outputs>: something that is not a folder (a
    file, a link) stands there or on the way to it."""
    out = work / outputs
    problem = _parents(work, outputs, "the outputs folder")
    if problem is None and (out.is_symlink() or (os.path.lexists(out) and not out.is_dir())):
        problem = (f"workdir/{outputs} exists in the job's inputs and is not a folder: the "
                   "outputs folder cannot be made there")
    return problem


def module_files(work: Path, pattern: str) -> list[str]:
    """The files a module glob matches under workdir/ (relative, sorted)."""
    return sorted(m for m in glob.glob(pattern, root_dir=work, recursive=True)
                  if not os.path.isdir(work / m))


def unmatched(pattern: str) -> str:
    return f"module glob {pattern!r} matched nothing"


def unmatched_module(work: Path, modules: tuple[str, ...], toolchain: str | None) -> str | None:
    """The first module glob that matches nothing in workdir/, of those the toolchain (at
    workdir/<toolchain>, fetched on the box) cannot add a match to."""
    for pattern in modules:
        if toolchain is not None and _may_reach(pattern, toolchain):
            continue
        if not module_files(work, pattern):
            return unmatched(pattern)
    return None


def _may_reach(pattern: str, path: str) -> bool:
    """Whether a glob may match under `path`: its literal leading folders are on `path`'s way,
    or it has none."""
    literal = []
    for part in PurePosixPath(pattern).parts:
        if MAGIC.search(part):
            break
        literal.append(part)
    target = PurePosixPath(path).parts
    n = min(len(literal), len(target))
    return tuple(literal[:n]) == target[:n]


def _parents(work: Path, rel: str, what: str) -> str | None:
    parts = PurePosixPath(rel).parts
    for i in range(1, len(parts)):
        p = work.joinpath(*parts[:i])
        if p.is_symlink() or (os.path.lexists(p) and not p.is_dir()):
            return (f"workdir/{'/'.join(parts[:i])} in the job's inputs is not a folder: {what} "
                    "cannot be placed under it")
    return None
