"""The Hub server's disk: repositories, commits, branch heads and content-addressed objects.

    ROOT/objects/<sha256[:2]>/<sha256>          file contents (regular and LFS alike)
    ROOT/objects/tmp/                           uploads in flight
    ROOT/repos/<kind>/<ns>/<name>/repo.json     visibility, creation time
    ROOT/repos/<kind>/<ns>/<name>/refs.json     {"main": <commit id>}
    ROOT/repos/<kind>/<ns>/<name>/commits/<id>.json

Every file is written to a temporary name and renamed into place, a commit before the ref
that points at it, so a crash leaves the last good state. Metadata is fsynced; objects are not
(a sandbox's power never fails, and fsyncing a GiB upload would dominate its cost). Object
bytes go to and from disk by direct I/O (`lowio.directio`), past the page cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lowio.directio import DirectWriter
from sandbox.hub.oids import content_oid, git_blob_oid, lfs_pointer

KINDS = ("model", "dataset", "space")
BRANCH = "main"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# what a new repository's first commit holds, as on the Hub: large binaries go to LFS
GITATTRIBUTES = (b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
                 b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
                 b"*.tar.* filter=lfs diff=lfs merge=lfs -text\n")


class HubError(Exception):
    """A request the store refuses: HTTP status, message, and the Hub's X-Error-Code if any."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Blob:
    """One file of a commit."""

    size: int
    sha256: str
    oid: str  # the git blob id trees show: of the content, or of the LFS pointer
    lfs: bool

    @classmethod
    def regular(cls, data: bytes) -> Blob:
        return cls(len(data), hashlib.sha256(data).hexdigest(), git_blob_oid(data), False)

    @classmethod
    def large(cls, sha256: str, size: int) -> Blob:
        return cls(size, sha256, git_blob_oid(lfs_pointer(sha256, size)), True)

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.sha256, self.size))


@dataclass
class Commit:
    id: str
    parent: str | None
    title: str
    message: str
    date: str
    files: dict[str, Blob] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "files": {p: asdict(b) for p, b in self.files.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Commit:
        files = {p: Blob(**b) for p, b in data["files"].items()}
        return cls(data["id"], data["parent"], data["title"], data["message"], data["date"], files)


@dataclass(frozen=True)
class Repo:
    kind: str
    repo_id: str
    private: bool
    created: str


# what a commit request asks for, in order
@dataclass(frozen=True)
class AddFile:
    path: str
    data: bytes


@dataclass(frozen=True)
class AddLfs:
    path: str
    sha256: str
    size: int | None  # a copy names only the oid


@dataclass(frozen=True)
class Delete:
    path: str
    folder: bool


Operation = AddFile | AddLfs | Delete


def check_path(path: str) -> str:
    parts = path.split("/")
    if not path or any(p in ("", ".", "..", ".git") for p in parts) or "\0" in path:
        raise HubError(400, f"invalid path in repo: {path!r}")
    return path


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class HubStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.objects = self.root / "objects"
        (self.objects / "tmp").mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._commits: dict[tuple[Path, str], Commit] = {}  # commits never change

    # --- repositories ------------------------------------------------------------------

    def _dir(self, kind: str, repo_id: str) -> Path:
        ns, _, name = repo_id.partition("/")
        if kind not in KINDS or not _NAME.match(ns) or not _NAME.match(name) \
                or name.endswith(".git"):
            raise HubError(404, f"Repository not found: {repo_id}", "RepoNotFound")
        return self.root / "repos" / kind / ns / name

    def create_repo(self, kind: str, repo_id: str, private: bool) -> Repo:
        """A new repository with its first commit (.gitattributes); 409 when it exists."""
        ns, _, name = repo_id.partition("/")
        if kind not in KINDS or not _NAME.match(ns) or not _NAME.match(name) \
                or name.endswith(".git"):
            raise HubError(400, f"invalid repository name {repo_id!r}")
        path = self._dir(kind, repo_id)
        with self._lock:
            if (path / "repo.json").exists():
                raise HubError(409, "You already created this repo",
                               headers={"X-Error-Message": "You already created this repo"})
            repo = Repo(kind, repo_id, private, now_iso())
            first = self._new_commit(None, {".gitattributes": self._add_bytes(GITATTRIBUTES)},
                                     "initial commit", "")
            self._save_commit(path, first)
            _write_atomic(path / "refs.json", json.dumps({BRANCH: first.id}).encode())
            _write_atomic(path / "repo.json", json.dumps(
                {"private": private, "created": repo.created}).encode())  # last: it exists now
            return repo

    def repo(self, kind: str, repo_id: str) -> Repo:
        path = self._dir(kind, repo_id)
        try:
            meta = json.loads((path / "repo.json").read_text())
        except FileNotFoundError:
            raise HubError(404, f"Repository not found: {repo_id}", "RepoNotFound") from None
        return Repo(kind, repo_id, bool(meta["private"]), str(meta["created"]))

    def refs(self, repo: Repo) -> dict[str, str]:
        refs: dict[str, str] = json.loads((self._dir(repo.kind, repo.repo_id) /
                                           "refs.json").read_text())
        return refs

    def head(self, repo: Repo, branch: str = BRANCH) -> str | None:
        return self.refs(repo).get(branch)

    # --- commits -------------------------------------------------------------------------

    def _commit_file(self, repo_dir: Path, oid: str) -> Path:
        return repo_dir / "commits" / f"{oid}.json"

    def _save_commit(self, repo_dir: Path, commit: Commit) -> None:
        _write_atomic(self._commit_file(repo_dir, commit.id),
                      json.dumps(commit.to_json()).encode())

    def _load(self, repo_dir: Path, oid: str) -> Commit | None:
        key = (repo_dir, oid)
        if key not in self._commits:
            try:
                data = json.loads(self._commit_file(repo_dir, oid).read_text())
            except FileNotFoundError:
                return None
            self._commits[key] = Commit.from_json(data)
        return self._commits[key]

    def resolve(self, repo: Repo, rev: str) -> Commit:
        """The commit a branch name or a commit id names; 404 RevisionNotFound otherwise."""
        repo_dir = self._dir(repo.kind, repo.repo_id)
        rev = rev.removeprefix("refs/heads/")
        oid = self.refs(repo).get(rev) or (rev if _COMMIT.match(rev) else None)
        commit = self._load(repo_dir, oid) if oid else None
        if commit is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return commit

    def history(self, repo: Repo, rev: str, limit: int = 10_000) -> list[Commit]:
        repo_dir = self._dir(repo.kind, repo.repo_id)
        out = [self.resolve(repo, rev)]
        while out[-1].parent and len(out) < limit:
            parent = self._load(repo_dir, out[-1].parent)
            if parent is None:
                break
            out.append(parent)
        return out

    def last_change(self, repo: Repo, commit: Commit, path: str) -> Commit:
        """The newest commit at or before `commit` that changed `path` (a file or a folder)."""
        repo_dir = self._dir(repo.kind, repo.repo_id)

        def view(c: Commit) -> Any:
            if path in c.files:
                return c.files[path]
            prefix = path + "/"
            return sorted((p, b.oid) for p, b in c.files.items() if p.startswith(prefix))

        mine = view(commit)
        while commit.parent:
            parent = self._load(repo_dir, commit.parent)
            if parent is None or view(parent) != mine:
                break
            commit = parent
        return commit

    def _new_commit(self, parent: Commit | None, files: dict[str, Blob], title: str,
                    message: str) -> Commit:
        parent_id = parent.id if parent else None
        oid = content_oid({"parent": parent_id, "title": title, "message": message,
                           "files": {p: b.oid for p, b in sorted(files.items())}})
        return Commit(oid, parent_id, title, message, now_iso(), files)

    def commit(self, repo: Repo, branch: str, parent_commit: str | None, title: str,
               message: str, operations: Iterable[Operation], keep: bool = True) -> Commit:
        """Apply `operations` on top of `branch`'s head and move the branch.

        `parent_commit`, when given, must be the head (412 otherwise: someone committed since).
        `keep=False` computes the commit and answers as if it were made, but stores nothing.
        """
        repo_dir = self._dir(repo.kind, repo.repo_id)
        with self._lock:
            head_id = self.head(repo, branch.removeprefix("refs/heads/"))
            if head_id is None:
                raise HubError(404, f"Invalid rev id: {branch} (commits go to a branch)",
                               "RevisionNotFound")
            if parent_commit is not None and parent_commit != head_id:
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            head = self._load(repo_dir, head_id)
            assert head is not None, f"{repo.repo_id}: branch points at a missing commit"
            files = dict(head.files)
            for op in operations:
                self._apply(files, op)
            commit = self._new_commit(head, files, title, message)
            if keep:
                self._save_commit(repo_dir, commit)
                refs = self.refs(repo)
                refs[branch.removeprefix("refs/heads/")] = commit.id
                _write_atomic(repo_dir / "refs.json", json.dumps(refs).encode())
            return commit

    def _apply(self, files: dict[str, Blob], op: Operation) -> None:
        path = check_path(op.path.strip("/") if isinstance(op, Delete) else op.path)
        if isinstance(op, AddFile):
            files[path] = self._add_bytes(op.data)
        elif isinstance(op, AddLfs):
            if not _SHA256.match(op.sha256) or not self.object_path(op.sha256).exists():
                raise HubError(400, f"{path}: LFS object {op.sha256} was never uploaded")
            size = self.object_path(op.sha256).stat().st_size
            if op.size is not None and op.size != size:
                raise HubError(400, f"{path}: LFS object {op.sha256} has {size} bytes, "
                               f"not {op.size}")
            files[path] = Blob.large(op.sha256, size)
        elif op.folder:
            gone = [p for p in files if p.startswith(path + "/")]
            if not gone:
                raise HubError(404, f"A folder with this name doesn't exist: {path}",
                               "EntryNotFound")
            for p in gone:
                del files[p]
        else:
            if files.pop(path, None) is None:
                raise HubError(404, f"A file with this name doesn't exist: {path}",
                               "EntryNotFound")

    # --- objects -------------------------------------------------------------------------

    def object_path(self, sha256: str) -> Path:
        return self.objects / sha256[:2] / sha256

    def has_object(self, sha256: str, size: int) -> bool:
        if not _SHA256.match(sha256):
            return False
        path = self.object_path(sha256)
        return path.exists() and path.stat().st_size == size

    def _add_bytes(self, data: bytes) -> Blob:
        blob = Blob.regular(data)
        if not self.object_path(blob.sha256).exists():
            self.put_object([data], len(data), blob.sha256)
        return blob

    def put_object(self, chunks: Iterable[bytes], size: int, sha256: str) -> None:
        """Store the bytes of `chunks` under `sha256`, hashing them on the way to disk; a body
        whose size or sha256 is not the one announced is refused (400) and nothing is kept."""
        if not _SHA256.match(sha256):
            raise HubError(400, f"invalid sha256 {sha256!r}")
        digest = hashlib.sha256()
        got = 0
        tmp = self.objects / "tmp" / f"{sha256}.{secrets.token_hex(4)}"
        try:
            with DirectWriter(tmp) as fh:
                for chunk in chunks:
                    digest.update(chunk)
                    fh.write(chunk)
                    got += len(chunk)
            if got != size or digest.hexdigest() != sha256:
                raise HubError(400, f"uploaded body has {got} bytes with sha256 "
                               f"{digest.hexdigest()}; expected {size} bytes with {sha256}")
            final = self.object_path(sha256)
            final.parent.mkdir(exist_ok=True)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
