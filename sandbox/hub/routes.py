"""The Hub's routes as huggingface_hub calls them, from a parsed request to a reply.

The server (`sandbox.hub.server`) parses HTTP and streams bodies; this module decides. Paths
are the Hub's: `/api/{models|datasets|spaces}/ns/name/...` for the API, and
`/{datasets/|spaces/|}ns/name/resolve/...` and `.../ns/name.git/info/lfs/objects/batch` for
file bytes. LFS uploads go to a signed `/_sandbox/lfs/<sha256>` URL (the client sends no token
there, as to the Hub's storage). `/_sandbox/faults` arms faults (see `sandbox.hub.faults`).
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import hmac
import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from sandbox.hub.faults import BUSY, GHOST_COMMIT, UPLOAD_REFUSED, WRONG_BYTES, HubFaults
from sandbox.hub.oids import content_oid
from sandbox.hub.store import (
    AddFile,
    AddLfs,
    Blob,
    Commit,
    Delete,
    HubError,
    HubStore,
    Operation,
    Repo,
    check_path,
)
from sandbox.hub.wire import FileSlice, Incoming, Reply, error_reply, is_true, parse_range

SHA256 = re.compile(r"^[0-9a-f]{64}$")
LFS_THRESHOLD = 1 << 20  # bigger files go by LFS, as do binary ones (the Hub's rule, smaller)
PLURAL = {"models": "model", "datasets": "dataset", "spaces": "space"}
PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
USER = "sandbox"


def upload_mode(sample: bytes, size: int) -> str:
    """`lfs` for big files and binary ones (a NUL or invalid UTF-8 in the sample)."""
    if size > LFS_THRESHOLD or b"\0" in sample:
        return "lfs"
    try:  # the sample may end inside a character: not final
        codecs.getincrementaldecoder("utf-8")().decode(sample, final=False)
    except UnicodeDecodeError:
        return "lfs"
    return "regular"


def file_entry(path: str, blob: Blob) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "oid": blob.oid, "size": blob.size, "path": path}
    if blob.lfs:
        entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": blob.pointer_size}
    return entry


def folder_entry(path: str, commit: Commit) -> dict[str, Any]:
    prefix = path + "/"
    oid = content_oid(sorted((p, b.oid) for p, b in commit.files.items()
                             if p.startswith(prefix)))
    return {"type": "directory", "oid": oid, "size": 0, "path": path}


def is_folder(commit: Commit, path: str) -> bool:
    prefix = path + "/"
    return any(p.startswith(prefix) for p in commit.files)


class HubApp:
    def __init__(self, store: HubStore, faults: HubFaults, token: str, secret: bytes) -> None:
        self.store = store
        self.faults = faults
        self._token = token
        self._secret = secret

    def __call__(self, req: Incoming) -> Reply:
        try:
            return self._route(req)
        except HubError as exc:
            return error_reply(exc)
        except (KeyError, TypeError, ValueError) as exc:  # a body without what the route reads
            return error_reply(HubError(400, f"malformed request: {exc!r}"))

    # --- dispatch ------------------------------------------------------------------------

    def _route(self, req: Incoming) -> Reply:
        seg = req.segments
        if seg[:2] == ["_sandbox", "lfs"] and len(seg) == 3 and req.method == "PUT":
            return self.lfs_put(req, seg[2])  # signed: the client sends no token here
        self._authorize(req)
        if seg[:2] == ["_sandbox", "faults"] and len(seg) == 2:
            return self.fault_route(req)
        if seg[:2] == ["_sandbox", "lfs"] and len(seg) == 4 and seg[3] == "verify":
            return self.lfs_verify(req, seg[2])
        if seg == ["api", "whoami-v2"]:
            return Reply.json({"type": "user", "name": USER, "fullname": USER,
                               "auth": {"type": "access_token",
                                        "accessToken": {"displayName": USER, "role": "write"}}})
        if seg == ["api", "repos", "create"] and req.method == "POST":
            return self.create_repo(req)
        if len(seg) >= 4 and seg[0] == "api" and seg[1] in PLURAL:
            return self._api(req, PLURAL[seg[1]], f"{seg[2]}/{seg[3]}", seg[4:])
        kind = "model"
        rest = seg
        if seg and seg[0] in PLURAL and seg[0] != "models":
            kind, rest = PLURAL[seg[0]], seg[1:]
        if len(rest) >= 5 and rest[2] == "resolve" and req.method in ("GET", "HEAD"):
            return self.resolve(req, kind, f"{rest[0]}/{rest[1]}", rest[3], "/".join(rest[4:]))
        if len(rest) == 6 and rest[1].endswith(".git") and rest[2:] == ["info", "lfs",
                                                                         "objects", "batch"]:
            return self.lfs_batch(req, kind, f"{rest[0]}/{rest[1][:-4]}")
        raise HubError(404, f"no route {req.method} /{'/'.join(seg)}")

    def _api(self, req: Incoming, kind: str, repo_id: str, rest: list[str]) -> Reply:
        repo = self.store.repo(kind, repo_id)
        op = rest[0] if rest else ""
        routes: dict[tuple[str, str], Callable[[Incoming, Repo, list[str]], Reply]] = {
            ("GET", ""): self.repo_info, ("GET", "revision"): self.repo_info,
            ("GET", "refs"): self.refs, ("GET", "commits"): self.commits,
            ("GET", "tree"): self.tree, ("POST", "paths-info"): self.paths_info,
            ("POST", "preupload"): self.preupload, ("POST", "commit"): self.commit,
        }
        handler = routes.get((req.method, op))
        if handler is None:
            raise HubError(404, f"no route {req.method} /api/.../{op}")
        return handler(req, repo, rest[1:])

    def _authorize(self, req: Incoming) -> None:
        auth = req.headers.get("Authorization") or ""
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not given:
            raise HubError(401, "Invalid username or password.")
        if not hmac.compare_digest(given.encode(), self._token.encode()):
            raise HubError(401, "Invalid credentials in Authorization header")

    # --- repositories ----------------------------------------------------------------------

    def create_repo(self, req: Incoming) -> Reply:
        body = req.json()
        kind = str(body.get("type") or "model")
        name = str(body.get("name") or "")
        repo_id = f"{body.get('organization') or USER}/{name}"
        visibility = body.get("visibility")
        private = visibility != "public" if visibility is not None \
            else bool(body.get("private", True))  # private unless asked otherwise
        url = f"{req.base_url}/{PREFIX.get(kind, '')}{repo_id}"
        try:
            self.store.create_repo(kind, repo_id, private)
        except HubError as exc:
            if exc.status != 409:
                raise
            # the Hub's conflict names the existing repo: exist_ok callers read its url
            reply = error_reply(exc)
            reply.body = json.dumps({"error": exc.message, "url": url}).encode()
            return reply
        return Reply.json({"url": url, "name": repo_id, "id": content_oid(repo_id)[:24]})

    def repo_info(self, req: Incoming, repo: Repo, rest: list[str]) -> Reply:
        commit = self.store.resolve(repo, rest[0] if rest else "main")
        ns = repo.repo_id.split("/")[0]
        return Reply.json({
            "_id": content_oid(repo.repo_id)[:24], "id": repo.repo_id, "author": ns,
            "sha": commit.id, "private": repo.private, "gated": False, "disabled": False,
            "createdAt": repo.created, "lastModified": commit.date, "tags": [],
            "downloads": 0, "likes": 0,
            "siblings": [{"rfilename": p} for p in sorted(commit.files)],
        })

    def refs(self, req: Incoming, repo: Repo, rest: list[str]) -> Reply:
        branches = [{"name": name, "ref": f"refs/heads/{name}", "targetCommit": oid}
                    for name, oid in sorted(self.store.refs(repo).items())]
        return Reply.json({"branches": branches, "converts": [], "tags": []})

    def commits(self, req: Incoming, repo: Repo, rest: list[str]) -> Reply:
        history = self.store.history(repo, rest[0] if rest else "main")
        return Reply.json([{"id": c.id, "title": c.title, "message": c.message, "date": c.date,
                            "authors": [{"user": USER, "avatar": ""}]} for c in history])

    # --- listing -------------------------------------------------------------------------

    def _expand(self, repo: Repo, commit: Commit, entry: dict[str, Any]) -> dict[str, Any]:
        last = self.store.last_change(repo, commit, entry["path"])
        return {**entry, "lastCommit": {"id": last.id, "title": last.title, "date": last.date}}

    def tree(self, req: Incoming, repo: Repo, rest: list[str]) -> Reply:
        if not rest:
            raise HubError(404, "tree needs a revision")
        commit = self.store.resolve(repo, rest[0])
        base = "/".join(rest[1:]).strip("/")
        if base and not is_folder(commit, base):
            raise HubError(404, f"{base} is not a folder at {commit.id}", "EntryNotFound",
                           {"X-Repo-Commit": commit.id})
        recursive = is_true(req.arg("recursive", "false"))
        prefix = base + "/" if base else ""
        folders: set[str] = set()
        files: dict[str, Blob] = {}
        for path, blob in commit.files.items():
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix):].split("/")
            if not recursive and len(parts) > 1:
                folders.add(prefix + parts[0])
                continue
            files[path] = blob
            folders.update(prefix + "/".join(parts[:i]) for i in range(1, len(parts)))
        entries = [folder_entry(p, commit) for p in folders] + \
                  [file_entry(p, b) for p, b in files.items()]
        entries.sort(key=lambda e: e["path"])
        if is_true(req.arg("expand", "false")):
            entries = [self._expand(repo, commit, e) for e in entries]
        return Reply.json(entries)

    def paths_info(self, req: Incoming, repo: Repo, rest: list[str]) -> Reply:
        commit = self.store.resolve(repo, rest[0] if rest else "main")
        form = parse_qs(req.read_body().decode(), keep_blank_values=True)
        entries = []
        for path in dict.fromkeys(p.strip("/") for p in form.get("paths", [])):
            if path in commit.files:
                entries.append(file_entry(path, commit.files[path]))
            elif path and is_folder(commit, path):
                entries.append(folder_entry(path, commit))
        if is_true(form.get("expand", ["false"])[0]):
            entries = [self._expand(repo, commit, e) for e in entries]
        return Reply.json(entries)

    # --- uploads -------------------------------------------------------------------------

    def preupload(self, req: Incoming, repo: Repo, rest: list[str]) -> Reply:
        commit = self.store.resolve(repo, rest[0] if rest else "main")
        answers = []
        for item in req.json().get("files", []):
            path = check_path(str(item["path"]))
            sample = base64.b64decode(item.get("sample") or "")
            mode = upload_mode(sample, int(item["size"]))
            known = commit.files.get(path)
            oid = None if known is None else known.sha256 if known.lfs else known.oid
            answers.append({"path": path, "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        return Reply.json({"files": answers, "commitOid": commit.id})

    def _sign(self, sha256: str, size: int) -> str:
        return hmac.new(self._secret, f"{sha256}:{size}".encode(), hashlib.sha256).hexdigest()

    def lfs_batch(self, req: Incoming, kind: str, repo_id: str) -> Reply:
        repo = self.store.repo(kind, repo_id)
        body = req.json()
        if body.get("operation") != "upload":
            raise HubError(400, "the sandbox store serves only LFS uploads")
        if self.faults.take(UPLOAD_REFUSED, repo.repo_id):
            raise HubError(403, "upload refused by the store (sandbox fault store_upload_refused)")
        objects = []
        for obj in body.get("objects", []):
            oid, size = str(obj.get("oid")), obj.get("size")
            if not SHA256.match(oid) or not isinstance(size, int) or size < 0:
                objects.append({"oid": oid, "size": size if isinstance(size, int) else 0,
                                "error": {"code": 422, "message": "invalid oid or size"}})
            elif self.store.has_object(oid, size):
                objects.append({"oid": oid, "size": size})  # no actions: already stored
            else:
                sig = self._sign(oid, size)
                href = f"{req.base_url}/_sandbox/lfs/{oid}"
                objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                    "upload": {"href": f"{href}?size={size}&sig={sig}"},
                    "verify": {"href": f"{href}/verify"},
                }})
        return Reply.json({"transfer": "basic", "objects": objects}, 200,
                          "application/vnd.git-lfs+json")

    def lfs_put(self, req: Incoming, sha256: str) -> Reply:
        try:
            size = int(req.arg("size"))
        except ValueError:
            raise HubError(400, "upload URL without a size") from None
        if not hmac.compare_digest(req.arg("sig"), self._sign(sha256, size)):
            raise HubError(403, "upload URL signature does not match")
        self.store.put_object(req.body_chunks(), size, sha256)
        return Reply(200)

    def lfs_verify(self, req: Incoming, sha256: str) -> Reply:
        body = req.json()
        if body.get("oid") != sha256 or not self.store.has_object(sha256, int(body.get("size",
                                                                                       -1))):
            raise HubError(404, f"LFS object {sha256} is not stored with that size")
        return Reply.json({"ok": True})

    def commit(self, req: Incoming, repo: Repo, rest: list[str]) -> Reply:
        if is_true(req.arg("create_pr", "0")):
            raise HubError(400, "the sandbox store does not do pull requests")
        branch = rest[0] if rest else "main"
        header: dict[str, Any] | None = None
        ops: list[Operation] = []
        for line in req.read_body().splitlines():
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                key, value = item["key"], item["value"]
            except (ValueError, KeyError, TypeError):
                raise HubError(400, "malformed commit line") from None
            if key == "header":
                header = value
            elif key == "file":
                content = value.get("content", "")
                data = base64.b64decode(content) if value.get("encoding") == "base64" \
                    else str(content).encode()
                ops.append(AddFile(str(value["path"]), data))
            elif key == "lfsFile":
                if value.get("algo", "sha256") != "sha256":
                    raise HubError(400, f"unsupported LFS algorithm {value.get('algo')!r}")
                size = value.get("size")
                ops.append(AddLfs(str(value["path"]), str(value["oid"]),
                                  int(size) if size is not None else None))
            elif key in ("deletedFile", "deletedFolder"):
                ops.append(Delete(str(value["path"]), key == "deletedFolder"))
            else:
                raise HubError(400, f"unknown commit operation {key!r}")
        if header is None or not str(header.get("summary", "")).strip():
            raise HubError(400, "a commit needs a header line with a summary")
        if self.faults.take(UPLOAD_REFUSED, repo.repo_id):
            raise HubError(403, "commit refused by the store (sandbox fault store_upload_refused)")
        ghost = self.faults.take(GHOST_COMMIT, repo.repo_id)
        made = self.store.commit(repo, branch, header.get("parentCommit"),
                                 str(header["summary"]), str(header.get("description") or ""),
                                 ops, keep=not ghost)
        url = f"{req.base_url}/{PREFIX[repo.kind]}{repo.repo_id}/commit/{made.id}"
        return Reply.json({"success": True, "commitOid": made.id, "commitUrl": url,
                           "hookOutput": ""})

    # --- downloads -----------------------------------------------------------------------

    def resolve(self, req: Incoming, kind: str, repo_id: str, rev: str, path: str) -> Reply:
        repo = self.store.repo(kind, repo_id)
        commit = self.store.resolve(repo, rev)
        blob = commit.files.get(path)
        if blob is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound",
                           {"X-Repo-Commit": commit.id})
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
                   "X-Repo-Commit": commit.id, "ETag": f'"{blob.oid}"'}
        if blob.lfs:
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size)})
        start, length, status = 0, blob.size, 200
        wanted = parse_range(req.headers.get("Range") or "", blob.size) \
            if req.headers.get("Range") and blob.size else None
        if wanted is not None:
            (start, length), status = wanted, 206
            headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{blob.size}"
        if req.method == "GET" and self.faults.take(BUSY, repo.repo_id):
            raise HubError(429, "the store is busy: try again later (sandbox fault store_busy)",
                           headers={"Retry-After": "1"})
        corrupt = req.method == "GET" and length > 0 and \
            self.faults.take(WRONG_BYTES, repo.repo_id)
        return Reply(status, headers,
                     file=FileSlice(self.store.object_path(blob.sha256), start, length, corrupt))

    # --- the sandbox's own control ---------------------------------------------------------

    def fault_route(self, req: Incoming) -> Reply:
        if req.method == "GET":
            return Reply.json({"faults": self.faults.pending()})
        if req.method == "DELETE":
            return Reply.json({"cleared": self.faults.clear()})
        if req.method == "POST":
            body = req.json()
            try:
                armed = self.faults.add(str(body.get("kind")), int(body.get("count", 1)),
                                        body.get("repo"))
            except (ValueError, TypeError) as exc:
                raise HubError(400, str(exc)) from None
            return Reply.json({"queued": armed})
        raise HubError(405, f"{req.method} not allowed on /_sandbox/faults")
