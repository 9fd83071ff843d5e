"""`job fetch`: the job's toolchain from the store, at a pinned commit, into the box's cache.

The toolchain is a Hub repository (`repo`, `repo_type`) at `revision`, which must be a 40-hex
commit: a branch or tag moves, and a measurement must name exactly what it ran with. It is
downloaded with huggingface_hub's `snapshot_download` into `<job area>/.cache/hub`
(agent.contract.job_cache: root-owned, read-only to the job's user) (the Hub's own
cache layout: blobs by digest, snapshots by commit) with the store token from `<root>/hf_token`,
and appears to the job as the symlink `workdir/<path>` -> the snapshot folder.

A second job on the same box with the same repo@commit fetches nothing and asks nothing of the
network: after a download this module writes its own marker (`<job area>/.cache/toolchains/...json`,
every file's size and mtime) and, when every file still matches it, skips huggingface_hub
altogether (it is not even imported). A file that does not match is removed from the cache so
that the download that follows replaces it.

huggingface_hub is imported here only, and only after the environment it reads at import time is
set (no Xet, no telemetry, no progress bars, no implicit token, its home under the root): the
supervising daemon never imports it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from agent.base.files import read_json, write_json
from agent.job.inputs import toolchain_place
from agent.job.model import Job, Refused, Toolchain

COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def fetch(job: Job) -> dict[str, Any] | None:
    """The toolchain record for the state, or None when the job names no toolchain.
    Raises Refused (one line, never the token) when it cannot be had."""
    tc = job.toolchain
    if tc is None:
        return None
    if not COMMIT.match(tc.revision):
        raise Refused(f"toolchain revision {tc.revision!r} is not a 40-hex commit: a branch "
                      "name is refused (pin the commit the measurement is to use)")
    if not REPO.match(tc.repo) or "--" in tc.repo:
        raise Refused(f"toolchain repo {tc.repo!r} is not a repository name")
    started = time.monotonic()
    cache = job.cache
    marker = cache / "toolchains" / f"{tc.repo_type}s--{tc.repo.replace('/', '--')}--" \
                                    f"{tc.revision}.json"
    warm = _warm(marker, tc)
    fetched = 0
    if warm is None:
        snapshot, fetched, files = _download(job, tc, cache / "hub")
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            write_json(marker, {"repo": tc.repo, "repo_type": tc.repo_type,
                                "revision": tc.revision, "snapshot": str(snapshot),
                                "files": files}, durable=True)
        except OSError:
            pass  # the next job then asks the store again; nothing is wrong with this one
    else:
        snapshot, files = warm
    _show(job, tc, snapshot)
    return {"repo": tc.repo, "repo_type": tc.repo_type, "revision": tc.revision,
            "path": tc.path, "snapshot": str(snapshot), "endpoint": job.store_endpoint,
            "files": len(files), "bytes_fetched": fetched,
            "bytes_total": sum(size for size, _ in files.values()),
            "seconds": round(time.monotonic() - started, 3), "warm": fetched == 0}


def _warm(marker: Path, tc: Toolchain) -> tuple[Path, dict[str, list[int]]] | None:
    """The cached snapshot when the marker names it and every file still has its recorded
    size and mtime (one stat each); mismatching files are removed for the download to replace."""
    raw = read_json(marker)
    if not isinstance(raw, dict) or (raw.get("repo"), raw.get("repo_type"),
                                     raw.get("revision")) != (tc.repo, tc.repo_type, tc.revision):
        return None
    snapshot, files = raw.get("snapshot"), raw.get("files")
    if not isinstance(snapshot, str) or not isinstance(files, dict) or not files:
        return None
    ok = True
    for rel, recorded in files.items():
        path = Path(snapshot) / rel
        try:
            st = path.stat()
            if [st.st_size, st.st_mtime_ns] == recorded:
                continue
        except OSError:
            pass
        ok = False
        _forget(path)
    return (Path(snapshot), files) if ok else None


def _forget(path: Path) -> None:
    """Remove a snapshot entry and the blob behind it (a changed file is fetched again)."""
    try:
        blob = path.resolve()
        if path.is_symlink() and blob.parent.name == "blobs":
            blob.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _download(job: Job, tc: Toolchain, cache: Path) -> tuple[Path, int, dict[str, list[int]]]:
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
    os.environ["HF_HOME"] = str(job.root / "cache" / "hf-home")
    token = _token(job.root / "hf_token")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.file_download import repo_folder_name
        from huggingface_hub.utils import logging as hf_logging
    except ImportError as e:
        raise Refused(f"huggingface_hub is not installed in the agent's environment: {e}") \
            from None
    hf_logging.set_verbosity_error()
    blobs = cache / repo_folder_name(repo_id=tc.repo, repo_type=tc.repo_type) / "blobs"
    before = _blobs(blobs)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        snapshot = Path(snapshot_download(
            tc.repo, repo_type=tc.repo_type, revision=tc.revision, cache_dir=cache,
            token=token if token else False, endpoint=job.store_endpoint))
    except Exception as e:
        raise Refused(_explain(e, tc, job.store_endpoint, token)) from None
    fetched = sum(size for name, size in _blobs(blobs).items() if name not in before)
    files: dict[str, list[int]] = {}
    for dirpath, dirnames, filenames in os.walk(snapshot):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            st = path.stat()
            files[path.relative_to(snapshot).as_posix()] = [st.st_size, st.st_mtime_ns]
    return snapshot, fetched, files


def _token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Refused(f"cannot read the store token {path}: {e.strerror}") from None


def _blobs(folder: Path) -> dict[str, int]:
    """Complete blobs (name -> size) in a repo's cache folder."""
    found = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return {}
    for entry in entries:
        if entry.name.endswith((".incomplete", ".lock")):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                found[entry.name] = entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return found


def _explain(e: Exception, tc: Toolchain, endpoint: str | None, token: str | None) -> str:
    """One line that says why, naming the repo and the store; never the token."""
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{tc.repo}@{tc.revision[:12]} from {endpoint or 'the default store'}"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, RevisionNotFoundError):
        why = "the revision is not in the repository"
    elif status == 401 or status == 403:
        why = f"the store refused the token ({status})"
    elif isinstance(e, RepositoryNotFoundError):
        why = "no such repository (or no access to it)"
    elif isinstance(e, HfHubHTTPError):
        why = f"the store answered {status}"
    elif isinstance(e, LocalEntryNotFoundError):
        cause = e.__cause__ or e.__context__
        why = "the store is unreachable" + (f" ({type(cause).__name__})" if cause else "")
    else:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        why = f"{type(e).__name__}: {first}".rstrip(": ")
    text = f"cannot fetch the toolchain {where}: {why}"
    return text.replace(token, "***") if token else text


def _show(job: Job, tc: Toolchain, snapshot: Path) -> None:
    """workdir/<path> -> the snapshot (replaced atomically; never over the job's own files)."""
    link = job.work / tc.path
    target = str(snapshot)
    taken = toolchain_place(job.work, tc.path)
    if taken is not None:
        raise Refused(taken)
    if link.is_symlink() and os.readlink(link) == target:
        return
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, link)
    except OSError as e:
        raise Refused(f"cannot place the toolchain at workdir/{tc.path}: {e.strerror or e}") \
            from None
