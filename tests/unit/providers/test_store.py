"""fleet.providers.store against the sandbox's Hub server, through the real huggingface_hub
client: one commit per push, read-back that names each differing file, and the store's faults as
fleet errors of one line."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hub_client import TOKEN
from huggingface_hub import CommitOperationAdd, HfApi, lfs

from fleet.core.errors import AuthFailed, FleetError, UsageError
from fleet.providers import store
from fleet.providers.http import RetryPolicy
from sandbox.hub import HubServer

REPO = "fleet/outputs"
MiB = 1 << 20


@pytest.fixture
def api(hub: HubServer) -> HfApi:
    return HfApi(endpoint=hub.url, token=TOKEN)


def make_outputs(root: Path, files: dict[str, bytes]) -> list[dict[str, Any]]:
    """Write `files` under `root`; their manifest, as the box's agent prints it."""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return [{"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for rel, data in sorted(files.items())]


@pytest.fixture
def outputs(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path / "out"
    manifest = make_outputs(root, {"log.txt": b"done\n", "res/b.bin": os.urandom(MiB + 17),
                                   "res/c.json": b'{"ok": true}\n'})
    return root, manifest


def one_line(e: pytest.ExceptionInfo[Any]) -> str:
    text = str(e.value)
    assert "\n" not in text and TOKEN not in text, text
    return text


# --- push and read back ------------------------------------------------------------------------

def test_push_is_one_commit_with_the_manifest_and_reads_back_equal(
        hub: HubServer, api: HfApi, outputs: tuple[Path, list[dict[str, Any]]]) -> None:
    root, manifest = outputs
    commit = store.push(REPO, root, manifest, "job1/box-a", "job1 on box-a")
    assert store.head(REPO) == commit
    info = api.repo_info(REPO, repo_type="dataset")
    assert info.private is True
    titles = [c.title for c in api.list_repo_commits(REPO, repo_type="dataset")]
    assert titles == ["job1 on box-a", "initial commit"]  # exactly one commit for the push
    tree = sorted(e.path for e in api.list_repo_tree(REPO, "job1/box-a", repo_type="dataset",
                                                     recursive=True, revision=commit))
    assert tree == ["job1/box-a/fleet-manifest.json", "job1/box-a/outputs",
                    "job1/box-a/outputs/log.txt", "job1/box-a/outputs/res",
                    "job1/box-a/outputs/res/b.bin", "job1/box-a/outputs/res/c.json"]
    stored = api.hf_hub_download(REPO, "job1/box-a/fleet-manifest.json", repo_type="dataset",
                                 revision=commit)
    assert json.loads(Path(stored).read_text()) == manifest
    assert store.read_back(REPO, commit, "job1/box-a", manifest) == []

    again = store.push(REPO, root, manifest, "job2/box-a", "job2 on box-a")
    assert store.head(REPO) == again != commit
    assert store.read_back(REPO, again, "job2/box-a", manifest) == []
    assert store.read_back(REPO, commit, "job1/box-a", manifest) == []  # an older commit stays


def test_read_back_names_each_file_the_store_serves_wrong(
        hub: HubServer, tmp_path: Path) -> None:
    data = os.urandom(MiB + 5)
    root = tmp_path / "out"
    manifest = make_outputs(root, {"b.bin": data})
    commit = store.push(REPO, root, manifest, "j/x", "j")
    hub.faults.add("store_wrong_bytes", count=2, repo=REPO)  # both downloads: b.bin, manifest
    lines = store.read_back(REPO, commit, "j/x", manifest)
    served = hashlib.sha256(bytes([data[0] ^ 0xFF]) + data[1:]).hexdigest()
    assert len(lines) == 2  # sorted by path: the manifest, then the outputs
    assert lines[0].startswith(f"j/x/fleet-manifest.json: store at {commit[:12]} has sha256 ")
    assert lines[1] == (f"j/x/outputs/b.bin: store at {commit[:12]} has sha256 {served}, "
                        f"manifest says {manifest[0]['sha256']}")
    assert hub.faults.pending() == []
    assert store.read_back(REPO, commit, "j/x", manifest) == []  # the store itself is fine


def test_read_back_asks_a_busy_store_again_after_its_retry_after(
        hub: HubServer, tmp_path: Path) -> None:
    root = tmp_path / "out"
    manifest = make_outputs(root, {"b.bin": os.urandom(MiB + 5)})
    commit = store.push(REPO, root, manifest, "j/x", "j")
    hub.faults.add("store_busy", count=2, repo=REPO)
    assert store.read_back(REPO, commit, "j/x", manifest) == []
    assert hub.faults.pending() == []  # both 429s were met and waited out


def test_read_back_reports_missing_resized_and_changed_files_from_the_listing(
        api: HfApi, hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]]) -> None:
    root, manifest = outputs
    pushed = store.push(REPO, root, manifest, "j", "j")
    other = os.urandom(MiB + 17)  # same size as res/b.bin, other bytes
    changed = api.create_commit(REPO, [
        CommitOperationAdd("j/outputs/res/b.bin", other),
        CommitOperationAdd("j/outputs/log.txt", b"longer\n"),
    ], commit_message="someone else", repo_type="dataset").oid
    api.delete_file("j/outputs/res/c.json", REPO, repo_type="dataset")
    after = store.head(REPO)
    assert after is not None
    lines = store.read_back(REPO, after, "j", manifest)
    short = after[:12]
    assert lines == [
        f"j/outputs/log.txt: store at {short} has 7 bytes, manifest says 5",
        f"j/outputs/res/b.bin: store at {short} lists sha256 {hashlib.sha256(other).hexdigest()}, "
        f"manifest says {manifest[1]['sha256']}",
        f"j/outputs/res/c.json: missing from the store at {short}",
    ]
    assert len(store.read_back(REPO, changed, "j", manifest)) == 2
    assert store.read_back(REPO, pushed, "j", manifest) == []


def test_read_back_of_a_commit_that_does_not_resolve_says_so(
        hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]]) -> None:
    root, manifest = outputs
    store.push(REPO, root, manifest, "j", "j")
    assert store.read_back(REPO, "ab" * 20, "j", manifest) == [
        f"{REPO}: commit {'ab' * 20} does not resolve in the store"]
    with pytest.raises(UsageError):
        store.read_back(REPO, "main", "j", manifest)


def test_an_output_named_like_the_manifest_is_stored_apart_from_it(
        hub: HubServer, tmp_path: Path) -> None:
    root = tmp_path / "out"
    manifest = make_outputs(root, {"fleet-manifest.json": b"an output\n", "r.txt": b"r"})
    commit = store.push(REPO, root, manifest, "j/x", "j")
    assert store.read_back(REPO, commit, "j/x", manifest) == []


@pytest.mark.parametrize(("name", "says"), [
    (".git/HEAD", "the Hub reserves the name .git"),
    ("deep/.cache/x.bin", "the Hub reserves the name .cache"),
    ("caf\udce9.txt", "a name that is not UTF-8"),
])
def test_a_name_the_store_cannot_hold_is_one_clear_error(hub: HubServer, tmp_path: Path,
                                                          name: str, says: str) -> None:
    manifest = [{"path": name, "size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}]
    with pytest.raises(FleetError) as e:  # never huggingface_hub's ValueError or a crash
        store.push(REPO, tmp_path, manifest, "j/x", "j")
    assert says in one_line(e)


def test_an_upload_that_fails_outside_http_is_a_store_error(
        hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, manifest = outputs

    def broken(*args: Any, **kwargs: Any) -> None:
        try:
            raise ConnectionResetError("peer reset")
        except ConnectionResetError as cause:
            raise RuntimeError("Error while uploading 'j/outputs/res/b.bin' to the Hub.") \
                from cause

    monkeypatch.setattr(HfApi, "create_commit", broken)
    with pytest.raises(store.StoreError) as e:
        store.push(REPO, root, manifest, "j", "j")
    assert "j/outputs/res/b.bin" in one_line(e) and "peer reset" in str(e.value)


# --- faults and refusals -------------------------------------------------------------------

def test_a_ghost_commit_is_caught_with_its_id(
        hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]]) -> None:
    root, manifest = outputs
    before = store.push(REPO, root, manifest, "j1", "first")
    hub.faults.add("store_ghost_commit", repo=REPO)
    with pytest.raises(store.StoreError) as e:
        store.push(REPO, root, manifest, "j2", "ghost")
    text = one_line(e)
    assert text.startswith("store create_commit: fleet/outputs answered commit ")
    ghost = text.split("answered commit ")[1].split(",")[0]
    assert len(ghost) == 40 and ghost != before and f"is at {before}" in text
    assert store.head(REPO) == before
    assert store.read_back(REPO, ghost, "j2", manifest) == [
        f"{REPO}: commit {ghost} does not resolve in the store"]


def test_a_refused_upload_is_one_line_naming_the_call_and_what_to_do(
        hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]]) -> None:
    root, manifest = outputs
    hub.faults.add("store_upload_refused", count=1)
    with pytest.raises(store.StoreError) as e:
        store.push(REPO, root, manifest, "j", "refused")
    text = one_line(e)
    assert text.startswith("store create_commit: fleet/outputs refused the upload (403): ")
    assert "store_upload_refused" in text and "then push again" in text
    assert store.head(REPO) is not None and hub.faults.pending() == []
    assert store.read_back(REPO, store.push(REPO, root, manifest, "j", "ok"), "j", manifest) == []


def test_a_commit_on_a_head_that_moved_is_made_again_on_the_new_head(
        api: HfApi, hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, manifest = outputs
    first = store.push(REPO, root, manifest, "j1", "first")
    real_head = store._head

    def stale_then_real(api_: HfApi, repo: str) -> str | None:
        # someone commits between push's read of the head and its commit (the store says 412)
        monkeypatch.setattr(store, "_head", real_head)
        api.create_commit(REPO, [CommitOperationAdd("other.txt", b"x\n")],
                          commit_message="someone else", repo_type="dataset")
        return first

    monkeypatch.setattr(store, "_head", stale_then_real)
    second = store.push(REPO, root, manifest, "j2", "second")
    titles = [c.title for c in api.list_repo_commits(REPO, repo_type="dataset")]
    assert titles[:3] == ["second", "someone else", "first"]  # on the new head, nothing lost
    assert store.head(REPO) == second
    assert store.read_back(REPO, second, "j2", manifest) == []
    assert store.read_back(REPO, second, "j1", manifest) == []


def test_a_head_that_moves_before_every_try_is_one_line_after_a_bounded_number(
        api: HfApi, hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, manifest = outputs
    store.push(REPO, root, manifest, "j1", "first")
    real_head = store._head
    tries: list[str | None] = []

    def always_stale(api_: HfApi, repo: str) -> str | None:
        head = real_head(api_, repo)
        tries.append(head)
        api.create_commit(REPO, [CommitOperationAdd(f"other-{len(tries)}.txt", b"x\n")],
                          commit_message="someone else", repo_type="dataset")
        return head

    monkeypatch.setattr(store, "_head", always_stale)
    with pytest.raises(store.StoreError) as e:
        store.push(REPO, root, manifest, "j2", "second")
    assert "someone committed since" in one_line(e) and f"{store.STALE_TRIES} tries" in str(e.value)
    assert len(tries) == store.STALE_TRIES
    assert [c.title for c in api.list_repo_commits(REPO, repo_type="dataset")][0] == \
        "someone else"


def test_two_pushes_to_one_repository_at_once_both_land(
        api: HfApi, hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # two teardowns push at once: both read the same head, one commits first and the other's
    # commit on that head is refused (412); it is made again on the new head
    root, manifest = outputs
    store.push(REPO, root, manifest, "j0", "first")
    real_head = store._head
    both_read = threading.Barrier(2)
    first_read: set[int] = set()

    def read_together(api_: HfApi, repo: str) -> str | None:
        head = real_head(api_, repo)
        me = threading.get_ident()
        if me not in first_read:
            first_read.add(me)
            both_read.wait(timeout=60)
        return head

    monkeypatch.setattr(store, "_head", read_together)
    commits: dict[str, str] = {}
    errors: list[BaseException] = []

    def push(prefix: str) -> None:
        try:
            commits[prefix] = store.push(REPO, root, manifest, prefix, prefix)
        except BaseException as e:  # noqa: BLE001 - the test's thread reports it below
            errors.append(e)

    threads = [threading.Thread(target=push, args=(p,)) for p in ("j1/box-a", "j2/box-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and sorted(commits) == ["j1/box-a", "j2/box-b"], errors
    monkeypatch.setattr(store, "_head", real_head)
    head = store.head(REPO)
    assert head in commits.values()
    for prefix in commits:
        assert store.read_back(REPO, head or "", prefix, manifest) == []


def test_a_local_copy_that_is_not_the_manifests_is_not_pushed(
        hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]]) -> None:
    root, manifest = outputs
    before = store.push(REPO, root, manifest, "j", "first")
    (root / "log.txt").write_bytes(b"done\n\n")  # another size: caught before any upload
    with pytest.raises(UsageError) as e:
        store.push(REPO, root, manifest, "k", "resized")
    assert "log.txt" in one_line(e) and "manifest says 5" in str(e.value)
    (root / "log.txt").write_bytes(b"done\n")
    # same size, other bytes than the manifest's (never stored before): the store checks each
    # upload against the sha256 it was announced with
    fresh = os.urandom(MiB + 3)
    bent = make_outputs(root, {"res/new.bin": fresh})
    (root / "res/new.bin").write_bytes(bytes([fresh[0] ^ 0xFF]) + fresh[1:])
    with pytest.raises(store.StoreError) as refused:
        store.push(REPO, root, bent, "k", "changed")
    assert "res/new.bin" in one_line(refused) and "copy it again" in str(refused.value)
    assert store.head(REPO) == before


def test_without_a_token_or_with_a_wrong_one_the_error_says_what_to_set(
        hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, manifest = outputs
    monkeypatch.delenv("HF_TOKEN")
    assert store.token() is None
    with pytest.raises(AuthFailed) as e:
        store.push(REPO, root, manifest, "j", "no token")
    assert one_line(e) == ("store token: no Hub token found (set HF_TOKEN or log in with "
                           "`hf auth login`)") and e.value.exit_code == 2
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(AuthFailed) as e:
        store.head(REPO)
    assert "refused the token" in one_line(e) and "hf_wrong" not in str(e.value)


def test_an_unreachable_store_or_repository_is_one_line(
        hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(store.StoreError) as e:
        store.head("fleet/nothing")
    assert one_line(e).startswith("store repo_info: repository fleet/nothing not found")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once it is closed
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed}")
    with pytest.raises(FleetError) as unreachable:
        store.head(REPO)
    assert "cannot reach the store" in one_line(unreachable)
    assert "HF_ENDPOINT" in str(unreachable.value)


# --- what push does not do ------------------------------------------------------------------

def test_push_hands_over_the_manifests_sha256_instead_of_hashing_again(
        hub: HubServer, api: HfApi, outputs: tuple[Path, list[dict[str, Any]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, manifest = outputs

    def no_hashing(fileobj: Any, *args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("a file was hashed again on the operator's side")

    monkeypatch.setattr(lfs, "sha_fileobj", no_hashing)
    commit = store.push(REPO, root, manifest, "j", "no rehash")
    assert store.read_back(REPO, commit, "j", manifest) == []
    # the same upload without the manifest's sha256 would have hashed: the check is real
    with pytest.raises(AssertionError, match="hashed again"):
        api.create_commit(REPO, [CommitOperationAdd("x/b.bin", str(root / "res/b.bin"))],
                          commit_message="plain", repo_type="dataset")


def test_push_toolchain_commits_a_tree_in_one_commit(hub: HubServer, api: HfApi,
                                                     tmp_path: Path) -> None:
    tc = tmp_path / "tc"
    make_outputs(tc, {"bin/prover": os.urandom(MiB + 1), "bin/run.sh": b"#!/bin/sh\n",
                      "VERSION": b"2.1\n"})
    with pytest.raises(store.StoreError, match="not found"):
        store.head("fleet/toolchains")  # push_toolchain makes the repository
    commit = store.push_toolchain("fleet/toolchains", tc, "toolchain 2.1")
    assert store.head("fleet/toolchains") == commit
    tree = sorted(e.path for e in api.list_repo_tree("fleet/toolchains", repo_type="dataset",
                                                     recursive=True, revision=commit))
    assert tree == [".gitattributes", "VERSION", "bin", "bin/prover", "bin/run.sh"]
    assert [c.title for c in api.list_repo_commits("fleet/toolchains", repo_type="dataset")] \
        == ["toolchain 2.1", "initial commit"]
    with pytest.raises(UsageError):
        store.push_toolchain("fleet/toolchains", tmp_path / "absent", "nothing")


class _Front(BaseHTTPRequestHandler):
    """The Hub's answer for an LFS file, and the CDN it redirects to (another host name).

    The CDN plays `script` first, one entry per GET: an HTTP status to answer with (a busy one
    says `Retry-After: 0`), or "cut" (the whole Content-Length promised, half of it sent, the
    connection closed); then it serves the blob, honouring a Range unless `ranges` is off."""

    seen: ClassVar[dict[str, str | None]] = {}
    gets: ClassVar[list[str | None]] = []  # each CDN GET's Range header
    script: ClassVar[list[int | str]] = []
    body: ClassVar[bytes] = b""
    commit: ClassVar[str] = ""
    cdn_status: ClassVar[int] = 200
    ranges: ClassVar[bool] = True

    def do_HEAD(self) -> None:
        self._answer()

    def do_GET(self) -> None:
        self._answer()

    def _answer(self) -> None:
        self.seen[f"{self.command} {self.path.split('?')[0]}"] = self.headers.get("Authorization")
        if "/resolve/" in self.path:
            port = self.server.server_address[1]
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{port}/cdn/blob?signature=s3cr3t")
            self.send_header("X-Repo-Commit", self.commit)
            self.send_header("X-Linked-Etag", '"cdn-etag"')
            self.send_header("X-Linked-Size", str(len(self.body)))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.gets.append(self.headers.get("Range"))
        step = self.script.pop(0) if self.script else self.cdn_status
        if step == "cut":
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body[:len(self.body) // 2])
            self.close_connection = True
            return
        status, body, start = int(step), self.body, 0
        wanted = self.headers.get("Range")
        if status == 200 and wanted and self.ranges:
            start, status = int(wanted.removeprefix("bytes=").removesuffix("-")), 206
        body = body[start:] if status in (200, 206) else b"no"
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(self.body) - 1}/"
                                              f"{len(self.body)}")
        if status in (408, 429, 503):
            self.send_header("Retry-After", "0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def cdn_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[HfApi, type[_Front]]]:
    class Front(_Front):
        seen: ClassVar[dict[str, str | None]] = {}
        gets: ClassVar[list[str | None]] = []
        script: ClassVar[list[int | str]] = []
        body = os.urandom(MiB + 3)
        commit = "c0ffee" * 6 + "abcd"

    server = ThreadingHTTPServer(("127.0.0.1", 0), Front)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    # the library's policy (6 tries, 1-8 s apart) with waits a test need not sit through
    monkeypatch.setattr(store, "_RETRY", RetryPolicy(attempts=6, base_delay=0.01, max_delay=0.02))
    yield HfApi(endpoint=url, token=TOKEN), Front
    server.shutdown()
    server.server_close()


def test_read_back_follows_the_hubs_redirect_to_a_cdn_without_the_token(
        cdn_hub: tuple[HfApi, type[_Front]]) -> None:
    api, front = cdn_hub
    path = "j/x/big.bin"
    want = store.Entry(path, len(front.body), hashlib.sha256(front.body).hexdigest())
    assert store._read_one(api, TOKEN, REPO, front.commit, path, want) is None
    assert front.seen[f"HEAD /datasets/{REPO}/resolve/{front.commit}/{path}"] == f"Bearer {TOKEN}"
    assert front.seen["GET /cdn/blob"] is None  # the signed URL carries its own credentials
    other = store.Entry(path, want.size, "0" * 64)
    assert store._read_one(api, TOKEN, REPO, front.commit, path, other) == (
        f"{path}: store at {front.commit[:12]} has sha256 {want.sha256}, manifest says {'0' * 64}")


def test_read_back_names_a_blob_the_cdn_lost_and_refuses_on_its_errors(
        cdn_hub: tuple[HfApi, type[_Front]]) -> None:
    api, front = cdn_hub
    want = store.Entry("a.bin", len(front.body), hashlib.sha256(front.body).hexdigest())
    front.cdn_status = 404
    assert store._read_one(api, TOKEN, REPO, front.commit, "a.bin", want) == (
        f"a.bin: missing from the store at {front.commit[:12]}")
    front.cdn_status, front.gets[:] = 500, []
    with pytest.raises(FleetError, match=r"a\.bin at c0ffeec0ffee: HTTP 500"):
        store._read_one(api, TOKEN, REPO, front.commit, "a.bin", want)
    assert len(front.gets) == 6  # asked again as huggingface_hub would, then refused


def test_read_back_waits_out_a_busy_cdn_and_resumes_a_cut_body_where_it_stopped(
        cdn_hub: tuple[HfApi, type[_Front]]) -> None:
    api, front = cdn_hub
    want = store.Entry("a.bin", len(front.body), hashlib.sha256(front.body).hexdigest())
    front.script[:] = [429, "cut", 503, "cut"]
    assert store._read_one(api, TOKEN, REPO, front.commit, "a.bin", want) is None
    half = f"bytes={len(front.body) // 2}-"
    assert front.gets == [None, None, half, half, half]  # a cut answer starts from byte 0
    # a store that answers a Range with the whole file is hashed from its start again
    front.ranges, front.gets[:] = False, []
    front.script[:] = ["cut"]
    assert store._read_one(api, TOKEN, REPO, front.commit, "a.bin", want) is None
    assert front.gets == [None, half]
    # the bytes after a resume are checked like any others
    other = store.Entry("a.bin", want.size, "0" * 64)
    front.ranges, front.script[:] = True, ["cut"]
    assert store._read_one(api, TOKEN, REPO, front.commit, "a.bin", other) == (
        f"a.bin: store at {front.commit[:12]} has sha256 {want.sha256}, manifest says {'0' * 64}")


def test_a_cdn_that_keeps_cutting_the_body_is_one_line_and_the_file_is_not_passed(
        cdn_hub: tuple[HfApi, type[_Front]]) -> None:
    api, front = cdn_hub
    want = store.Entry("a.bin", len(front.body), hashlib.sha256(front.body).hexdigest())
    front.script[:] = ["cut"] * 6
    with pytest.raises(FleetError, match=r"a\.bin at c0ffeec0ffee: cannot read it from the "
                                         r"store: IncompleteRead") as e:
        store._read_one(api, TOKEN, REPO, front.commit, "a.bin", want)
    one_line(e)
    assert len(front.gets) == 6


def test_a_commit_that_landed_is_ours_though_another_lands_right_after_it(
        api: HfApi, hub: HubServer, outputs: tuple[Path, list[dict[str, Any]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # another teardown's commit lands between our create_commit and what follows it: ours is
    # stored (history shows it), so the push reports it, not a failure that keeps the box and
    # pushes it again at the next teardown
    root, manifest = outputs
    store.push(REPO, root, manifest, "j0", "zero")
    real_commit = api.create_commit
    real_create = HfApi.create_commit

    def then_another(self: HfApi, *args: Any, **kwargs: Any) -> Any:
        info = real_create(self, *args, **kwargs)
        real_commit(REPO, [CommitOperationAdd("j9/x.txt", b"x\n")],
                    commit_message="another teardown", repo_type="dataset")
        return info

    monkeypatch.setattr(HfApi, "create_commit", then_another)
    commit = store.push(REPO, root, manifest, "j1", "mine")
    monkeypatch.setattr(HfApi, "create_commit", real_create)
    titles = [c.title for c in api.list_repo_commits(REPO, repo_type="dataset")]
    assert titles[:3] == ["another teardown", "mine", "zero"]
    assert commit == api.list_repo_commits(REPO, repo_type="dataset")[1].commit_id
    assert store.read_back(REPO, commit, "j1", manifest) == []
