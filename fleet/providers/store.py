"""The store: outputs and toolchains in Hugging Face Hub repositories, each push one commit.

The Hub is `HF_ENDPOINT` (the real one when unset), the token `HF_TOKEN` or the token file that
`hf auth login` writes. Repositories are private datasets unless they already exist.

    push(repo, files, manifest, path_in_repo, message)   one commit of files + their manifest
    read_back(repo, commit, path_in_repo, manifest)      what differs, one line per file
    push_toolchain(repo, local_dir, message)             one commit of a directory tree
    head(repo)                                           main's commit id
    token()                                              the token, or None when there is none

A manifest is the box's list of `{path, size, sha256}` (`python -m agent manifest DIR`), paths
relative to the pushed folder; `push` stores the files under `<path_in_repo>/outputs/` and the
manifest as `<path_in_repo>/fleet-manifest.json`, where no output's name can reach it.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import urlsplit

import httpx2
from huggingface_hub import CommitOperationAdd, HfApi, constants, get_token, hf_hub_url
from huggingface_hub._commit_api import FORBIDDEN_FOLDERS
from huggingface_hub.errors import (
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import get_hf_file_metadata
from huggingface_hub.utils import build_hf_headers, disable_progress_bars

from fleet.core.errors import AuthFailed, FleetError, ProviderError, UsageError
from fleet.providers.http import RetryPolicy, retry_after
from fleet.state.archive import MANIFEST as MANIFEST_NAME
from fleet.state.archive import OUTPUTS
from lowio.directio import DirectReader

REPO_TYPE = "dataset"
BRANCH = "main"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_READERS = 4  # files read back at once


class StoreError(ProviderError):
    """The store refused or failed a call; the message names the call and what to do."""

    def __init__(self, call: str, detail: str, hint: str = "") -> None:
        super().__init__("store", call, detail, hint)


class Unstorable(UsageError):
    """Outputs the store cannot hold by their names: they stay so until someone renames them."""


class StaleHead(StoreError):
    """The store's 412: the commit was made on a head that is not main's any more."""


@dataclass(frozen=True)
class Entry:
    path: str
    size: int
    sha256: str


def entries(manifest: Sequence[Mapping[str, Any]]) -> list[Entry]:
    """The manifest's rows, checked: relative paths without `..`, sizes, sha256 hex."""
    out: list[Entry] = []
    for n, row in enumerate(manifest):
        try:
            entry = Entry(str(row["path"]), int(row["size"]), str(row["sha256"]).lower())
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"manifest row {n}: needs path, size and sha256") from None
        parts = entry.path.split("/")
        if entry.path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise UsageError(f"manifest row {n}: {entry.path!r} is not a relative path")
        if entry.size < 0 or not _SHA256.match(entry.sha256):
            raise UsageError(f"manifest row {n} ({entry.path}): bad size or sha256")
        out.append(entry)
    if len({e.path for e in out}) != len(out):
        raise UsageError("manifest names a path twice")
    return sorted(out, key=lambda e: e.path)


def manifest_bytes(rows: Sequence[Entry]) -> bytes:
    """The manifest as stored beside the files (the same bytes for the same rows)."""
    data = [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in rows]
    return (json.dumps(data, indent=1) + "\n").encode()


def _in_repo(prefix: str, path: str) -> str:
    return f"{prefix}/{path}" if prefix else path


def _output(prefix: str, path: str) -> str:
    """Where an output file lives in the repo: below `outputs/`, apart from the manifest."""
    return _in_repo(_in_repo(prefix, OUTPUTS), path)


def _unstorable(path: str) -> str | None:
    """Why the Hub cannot hold an output at `path` (None when it can): a name that is not
    UTF-8, or a folder it reserves (huggingface_hub refuses `.git/` and `.cache/`)."""
    try:
        path.encode("utf-8")
    except UnicodeError:
        return f"{path.encode('utf-8', 'surrogateescape')!r}: a name that is not UTF-8"
    for reserved in FORBIDDEN_FOLDERS:
        if reserved in path.split("/"):
            return f"{path}: the Hub reserves the name {reserved}"
    return None


def _prefix(path_in_repo: str) -> str:
    prefix = path_in_repo.strip("/")
    if any(p in (".", "..") for p in prefix.split("/")):
        raise UsageError(f"path in repo {path_in_repo!r} must not hold . or ..")
    return prefix


# --- talking to the Hub --------------------------------------------------------------------

def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def token() -> str | None:
    """The operator's Hub token (HF_TOKEN, else the token file), or None. Never print it."""
    return get_token() or None


def _api() -> tuple[HfApi, str]:
    """A client for HF_ENDPOINT with the operator's token (never printed)."""
    # huggingface_hub reads these at import; a process that loaded the sandbox's environment
    # afterwards still means them (Xet off: the sandbox's store speaks plain LFS)
    if _is_true(os.environ.get("HF_HUB_DISABLE_XET")):
        constants.HF_HUB_DISABLE_XET = True
    # the CLI prints its own progress lines; the library's bars would garble them
    disable_progress_bars()
    secret = token()
    if not secret:
        raise AuthFailed("store", "token", "no Hub token found",
                         "set HF_TOKEN or log in with `hf auth login`")
    endpoint = os.environ.get("HF_ENDPOINT", "").rstrip("/") or None
    return HfApi(endpoint=endpoint, token=secret, library_name="fleet"), secret


@contextmanager
def _call(call: str, repo: str) -> Iterator[None]:
    """Turn the library's failures into one-line fleet errors naming `call` and a remedy."""
    try:
        yield
    except HfHubHTTPError as e:
        raise _refusal(call, repo, e) from None
    except RuntimeError as e:
        # an LFS upload's failure comes wrapped: "Error while uploading 'path' to the Hub."
        what = str(e).removeprefix("Error while uploading ").removesuffix(" to the Hub.")
        if isinstance(e.__cause__, HfHubHTTPError):
            raise _refusal(call, repo, e.__cause__, f"upload of {what}: ") from None
        cause = f" ({type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ else ""
        raise StoreError(call, f"{repo}: {what}{cause}"[:300],
                         "check the store's LFS endpoint and push again") from None
    except (ValueError, UnicodeError) as e:  # what the library refuses before any request
        raise StoreError(call, f"{repo}: {type(e).__name__}: {e}"[:300]) from None
    except OSError as e:  # the local copy unreadable while it is sent (a disk error)
        raise StoreError(call, f"{repo}: cannot read the local copy: {e}"[:300]) from None
    except httpx2.TransportError as e:
        raise StoreError(call, f"cannot reach the store: {type(e).__name__}: {e}",
                         "check HF_ENDPOINT and the network") from None


def _refusal(call: str, repo: str, e: HfHubHTTPError, where: str = "") -> FleetError:
    if isinstance(e, RepositoryNotFoundError):
        return StoreError(call, f"repository {repo} not found, or the token cannot see it",
                          "check the repository name and HF_TOKEN")
    if isinstance(e, RevisionNotFoundError):
        return StoreError(call, f"{repo}: no such branch or commit", "check the commit id")
    status = e.response.status_code if e.response is not None else None
    said = " ".join((e.server_message or str(e).strip().splitlines()[0]).split())
    if status == 401:
        return AuthFailed("store", call, f"the store refused the token ({said})",
                          "check HF_TOKEN")
    if status == 412:
        return StaleHead(call, f"{repo}: someone committed since its head was read",
                          "push again onto the new head")
    if status == 403:
        return StoreError(call, f"{repo} refused the upload (403): {where}{said}",
                          f"check that the token may write to {repo} and the repository's "
                          "quota, then push again")
    if where and status == 400:
        return StoreError(call, f"{repo}: {where}refused (400): {said}",
                          "the local copy is not the bytes its manifest names; copy it again")
    return StoreError(call, f"{repo}: {where}HTTP {status}: {said}",
                      "see the store's status, then try again")


def _head(api: HfApi, repo: str) -> str | None:
    with _call("repo_info", repo):
        try:
            info = api.repo_info(repo, repo_type=REPO_TYPE, revision=BRANCH)
        except RevisionNotFoundError:
            return None  # a repository without a commit
    return info.sha


def head(repo: str) -> str | None:
    """The commit id `main` of `repo` points at; None while it has no commit."""
    api, _ = _api()
    return _head(api, repo)


@dataclass
class _KnownAdd(CommitOperationAdd):
    """A file added with the sha256 and size its manifest gives.

    huggingface_hub learns an LFS file's sha256 by reading the whole file (`UploadInfo.sha256`
    computed on first access) before it reads it again to upload it: two passes over every
    byte. The manifest's sha256 was computed where the file was made; a local copy that
    differs from it is refused by a store that checks uploads (the sandbox's does) and is
    caught by `read_back` in any case, so handing it over loses no safety and saves a pass.
    """

    known_sha256: str = field(default="", kw_only=True)
    known_size: int = field(default=-1, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()  # checks the path; reads only the file's first 512 bytes
        if self.upload_info.size != self.known_size:
            raise UsageError(f"{self.path_in_repo}: the local copy has "
                             f"{self.upload_info.size} bytes, the manifest says "
                             f"{self.known_size}")
        self.upload_info.sha256 = bytes.fromhex(self.known_sha256)

    @contextmanager
    def as_file(self, with_tqdm: bool = False) -> Iterator[BinaryIO]:
        """The file for its upload, read by direct I/O as the archive wrote it (no progress
        bars: the CLI prints its own lines)."""
        with DirectReader(Path(str(self.path_or_fileobj))) as fh:
            yield cast(BinaryIO, fh)


STALE_TRIES = 5  # commits on a head that moved meanwhile (412), each on the head read anew


def _commit(api: HfApi, repo: str, ops: list[Any], message: str) -> str:
    """One commit of `ops` on main's current head; the returned id is checked to resolve.

    The commit pins the head it was made on (`parent_commit`): a store that moved meanwhile
    (another teardown's push to the same repository) refuses it with 412, and it is made
    again on the head read anew, STALE_TRIES times in all. The files were uploaded by the
    first try (huggingface_hub marks them so): a try again sends only the commit. Each push
    writes under a path of its own (`<job>/<label>`), so no try replaces another's files."""
    with _call("create_repo", repo):
        api.create_repo(repo, repo_type=REPO_TYPE, private=True, exist_ok=True)
    for attempt in range(1, STALE_TRIES + 1):
        parent = _head(api, repo)
        try:
            with _call("create_commit", repo):
                info = api.create_commit(repo, ops, commit_message=message,
                                         repo_type=REPO_TYPE, revision=BRANCH,
                                         parent_commit=parent)
        except StaleHead as e:
            if attempt == STALE_TRIES:
                raise StaleHead("create_commit", f"{e.detail} ({attempt} tries)",
                                e.hint) from None
            continue
        break
    if not _resolves(api, repo, info.oid):
        now = _head(api, repo)
        raise StoreError("create_commit", f"{repo} answered commit {info.oid}, but it does not "
                         f"resolve and its {BRANCH} is at {now or 'no commit'}: the commit was "
                         "not stored", "push again and report the store's fault")
    return str(info.oid)


def _resolves(api: HfApi, repo: str, commit: str) -> bool:
    """Whether the store holds `commit`, asked by its own id: another push may land right
    after ours, so the head tells nothing about ours."""
    with _call("repo_info", repo):
        try:
            info = api.repo_info(repo, repo_type=REPO_TYPE, revision=commit)
        except RevisionNotFoundError:
            return False
    return bool(info.sha == commit)


def push(repo: str, files: Path, manifest: Sequence[Mapping[str, Any]], path_in_repo: str,
         message: str) -> str:
    """Commit the manifest's files from `files` (and the manifest) under `path_in_repo`.

    One `create_commit` on main's head read just before (a commit in between is refused, not
    merged); returns the commit id after checking that the store holds it.
    """
    rows = entries(manifest)
    prefix = _prefix(path_in_repo)
    unstorable = [why for e in rows if (why := _unstorable(e.path))]
    if unstorable:
        raise Unstorable(f"the store cannot hold {len(unstorable)} of the outputs: "
                         + "; ".join(unstorable[:5]))
    ops: list[Any] = []
    for e in rows:
        local = Path(files) / e.path
        if not local.is_file():
            raise UsageError(f"{e.path}: not a file under {files}")
        try:
            ops.append(_KnownAdd(_output(prefix, e.path), str(local),
                                 known_sha256=e.sha256, known_size=e.size))
        except OSError as err:
            raise UsageError(f"{e.path}: cannot read the local copy: {err.strerror}") from None
    ops.append(CommitOperationAdd(_in_repo(prefix, MANIFEST_NAME), manifest_bytes(rows)))
    api, _ = _api()
    return _commit(api, repo, ops, message)


def push_toolchain(repo: str, local_dir: Path, message: str) -> str:
    """Commit every file under `local_dir` at the same paths in `repo`, in one commit.

    Files the repository holds that `local_dir` lacks stay; symlinks are not followed.
    """
    root = Path(local_dir)
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory")
    ops: list[Any] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                ops.append(CommitOperationAdd(path.relative_to(root).as_posix(), str(path)))
    if not ops:
        raise UsageError(f"{root} holds no file to push")
    api, _ = _api()
    return _commit(api, repo, ops, message)


# --- reading back --------------------------------------------------------------------------

_READ = 1 << 20  # bytes each read-back read asks the socket for
_BUSY = frozenset({408, 429, 500, 502, 503, 504})  # asked again, as huggingface_hub does
_RETRY = RetryPolicy(attempts=6, base_delay=1.0, max_delay=8.0)  # its 5 retries, 1-8 s


def _hub_host(url: str, endpoint: str) -> bool:
    a, b = urlsplit(url), urlsplit(endpoint)
    return (a.scheme, a.netloc) == (b.scheme, b.netloc)


def _download_hashed(url: str, headers: Mapping[str, str]) -> tuple[int, str]:
    """GET `url` and hash its body as it arrives: (bytes, sha256 hex). Nothing is stored.

    The body goes from the socket into one reused buffer and from there to the hash, each
    step outside the GIL, so the readers run on every core; huggingface_hub's `http_get`
    hands its body through httpx's per-64-KiB chunks and re-joins them, which costs this
    process more than the hashing does. Redirects are followed, without `headers` beyond
    the first host (a signed CDN URL carries its own credentials); proxies come from the
    environment, as for every urllib caller.

    As huggingface_hub's own download does, a busy store (408, 429, 5xx) is asked again after
    its Retry-After or a backoff, and a body cut short is resumed where it stopped (a Range
    request; the hash goes on), `_RETRY.attempts` tries in all; a server that answers a Range
    with the whole file is read from its start again. The last HTTP error is raised as
    `urllib.error.HTTPError`, a network one as `OSError` or `http.client.HTTPException`."""
    policy, digest, size = _RETRY, hashlib.sha256(), 0
    buf = memoryview(bytearray(_READ))
    for attempt in range(policy.attempts):
        req = urllib.request.Request(url)
        for name, value in headers.items():
            req.add_unredirected_header(name, value)  # never sent to where a redirect points
        if size:
            req.add_header("Range", f"bytes={size}-")
        last = attempt + 1 == policy.attempts
        try:
            with urllib.request.urlopen(req, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as resp:
                if size and not _resumes_at(resp, size):
                    digest, size = hashlib.sha256(), 0
                while n := resp.readinto(buf):
                    digest.update(buf[:n])
                    size += n
                if resp.length:  # the connection closed before Content-Length was reached
                    raise http.client.IncompleteRead(b"", resp.length)
            return size, digest.hexdigest()
        except urllib.error.HTTPError as e:
            e.close()
            if last or e.code not in _BUSY:
                raise
            wait = retry_after(e)
            time.sleep(min(wait, policy.max_retry_after) if wait is not None
                       else policy.backoff(attempt))
        except (OSError, http.client.HTTPException):
            if last:
                raise
            time.sleep(policy.backoff(attempt))
    raise AssertionError("unreachable: the last attempt returns or raises")


def _resumes_at(resp: http.client.HTTPResponse, offset: int) -> bool:
    """Whether `resp` is the part of the file from `offset` on (206 with that Content-Range)."""
    return resp.status == 206 and \
        (resp.headers.get("Content-Range") or "").startswith(f"bytes {offset}-")


def _read_one(api: HfApi, secret: str, repo: str, commit: str, path: str,
              want: Entry) -> str | None:
    """Download `path` at `commit` afresh, hashing it as it arrives; a line if it differs."""
    url = hf_hub_url(repo, path, repo_type=REPO_TYPE, revision=commit, endpoint=api.endpoint)
    short = commit[:12]
    with _call("download", repo):
        try:
            meta = get_hf_file_metadata(url, token=secret, library_name="fleet",
                                        retry_on_errors=True)
        except RemoteEntryNotFoundError:
            return f"{path}: missing from the store at {short}"
    if meta.commit_hash != commit:
        return f"{path}: the store served commit {meta.commit_hash} when asked for {short}"
    # an LFS file's location may be a CDN's signed URL: the token stays with the Hub
    where = meta.location or url
    headers = build_hf_headers(token=secret if _hub_host(where, api.endpoint) else False,
                               library_name="fleet")
    try:
        size, got = _download_hashed(where, headers)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return f"{path}: missing from the store at {short}"
        raise StoreError("download", f"{repo}: {path} at {short}: HTTP {e.code}: {e.reason}",
                         "see the store's status, then try again") from None
    except (OSError, http.client.HTTPException) as e:  # a cut body is IncompleteRead
        raise StoreError("download", f"{repo}: {path} at {short}: cannot read it from the "
                         f"store: {type(e).__name__}: {e}",
                         "check HF_ENDPOINT and the network") from None
    if size != want.size:
        return f"{path}: store at {short} sent {size} bytes, manifest says {want.size}"
    if got != want.sha256:
        return f"{path}: store at {short} has sha256 {got}, manifest says {want.sha256}"
    return None


def read_back(repo: str, commit: str, path_in_repo: str,
              manifest: Sequence[Mapping[str, Any]]) -> list[str]:
    """What differs between the store's `commit` and the manifest: one line per file, none
    when equal. The listing is checked first (presence, sizes, LFS sha256), then every file is
    downloaded anew (no cache is read or written) and hashed as it streams.
    """
    if not _COMMIT.match(commit):
        raise UsageError(f"read-back needs a 40-hex commit id, not {commit!r}")
    rows = entries(manifest)
    prefix = _prefix(path_in_repo)
    blob = manifest_bytes(rows)
    wanted = {_output(prefix, e.path): e for e in rows}
    wanted[_in_repo(prefix, MANIFEST_NAME)] = Entry(
        MANIFEST_NAME, len(blob), hashlib.sha256(blob).hexdigest())
    api, secret = _api()
    short = commit[:12]
    listed: dict[str, Any] = {}
    paths = sorted(wanted)
    with _call("get_paths_info", repo):
        try:
            for i in range(0, len(paths), 200):
                for item in api.get_paths_info(repo, paths[i:i + 200], revision=commit,
                                               repo_type=REPO_TYPE):
                    listed[item.path] = item
        except RevisionNotFoundError:
            return [f"{repo}: commit {commit} does not resolve in the store"]
    lines: dict[str, str] = {}
    to_read: list[str] = []
    for path in paths:
        want, info = wanted[path], listed.get(path)
        lfs = getattr(info, "lfs", None)
        if info is None or not hasattr(info, "size"):
            lines[path] = f"{path}: missing from the store at {short}"
        elif info.size != want.size:
            lines[path] = f"{path}: store at {short} has {info.size} bytes, " \
                          f"manifest says {want.size}"
        elif lfs is not None and lfs.sha256 != want.sha256:
            lines[path] = f"{path}: store at {short} lists sha256 {lfs.sha256}, " \
                          f"manifest says {want.sha256}"
        else:
            to_read.append(path)
    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        found = pool.map(lambda p: (p, _read_one(api, secret, repo, commit, p, wanted[p])),
                         to_read)
        lines.update({p: line for p, line in found if line})
    return [lines[p] for p in sorted(lines)]
