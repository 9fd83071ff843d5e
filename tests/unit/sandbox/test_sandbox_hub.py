"""The sandbox's Hub server against the real huggingface_hub client: repos, commits (regular and
LFS), listings, downloads, persistence, auth, and the three store faults."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    constants,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from sandbox import manage
from sandbox.control_client import ControlClient
from sandbox.hub import HubServer, client_env

TOKEN = "hf_sandbox_test_token_0123456789"
REPO = "fleet/outputs"
MiB = 1 << 20


def point_client(monkeypatch: pytest.MonkeyPatch, url: str, home: Path) -> None:
    """The environment `.sandbox/env` gives, and the library's copies of it: huggingface_hub
    reads these at import, which may have happened before this test."""
    for name, value in {**client_env(url, TOKEN), "HF_HOME": str(home)}.items():
        monkeypatch.setenv(name, value)
    library: dict[str, object] = {
        "ENDPOINT": url,
        "HUGGINGFACE_CO_URL_TEMPLATE": url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_DISABLE_XET": True, "HF_HUB_DISABLE_TELEMETRY": True, "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"), "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
    }
    for name, setting in library.items():
        monkeypatch.setattr(constants, name, setting)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    server = HubServer(tmp_path / "hub", TOKEN, poll_interval=0.01)
    point_client(monkeypatch, server.url, tmp_path / "hf-home")
    yield server
    server.close()


@pytest.fixture
def api(hub: HubServer) -> HfApi:
    return HfApi(endpoint=hub.url, token=TOKEN)


@pytest.fixture
def repo(api: HfApi) -> str:
    api.create_repo(REPO, repo_type="dataset")
    return REPO


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def head(api: HfApi, repo: str = REPO) -> str:
    sha = api.repo_info(repo, repo_type="dataset").sha
    assert sha is not None
    return sha


def commit(api: HfApi, files: dict[str, bytes], message: str = "add",
           parent: str | None = None, repo: str = REPO) -> str:
    ops = [CommitOperationAdd(path, data) for path, data in files.items()]
    info = api.create_commit(repo, ops, commit_message=message, repo_type="dataset",
                             parent_commit=parent)
    return str(info.oid)


def status_of(exc: pytest.ExceptionInfo[HfHubHTTPError]) -> int:
    assert exc.value.response is not None
    return exc.value.response.status_code


# --- repositories ----------------------------------------------------------------------------

def test_create_repo_is_private_by_default_and_409_when_it_exists(api: HfApi) -> None:
    url = api.create_repo(REPO, repo_type="dataset")
    assert url.endswith("/datasets/fleet/outputs")
    assert api.repo_info(REPO, repo_type="dataset").private is True
    assert api.create_repo(REPO, repo_type="dataset", exist_ok=True) == url
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_repo(REPO, repo_type="dataset")
    assert status_of(exc) == 409
    api.create_repo("fleet/open", repo_type="dataset", private=False)
    assert api.repo_info("fleet/open", repo_type="dataset").private is False
    # a new repository starts with one commit, as on the Hub
    assert [c.title for c in api.list_repo_commits(REPO, repo_type="dataset")] == [
        "initial commit"]


def test_models_live_without_a_prefix(api: HfApi, hub: HubServer, tmp_path: Path) -> None:
    api.create_repo("fleet/toolchain")
    oid = api.create_commit("fleet/toolchain", [CommitOperationAdd("bin/tool", b"#!/bin/sh\n")],
                            commit_message="tool").oid
    path = hf_hub_download("fleet/toolchain", "bin/tool", revision=oid,
                           cache_dir=tmp_path / "cache", endpoint=hub.url)
    assert Path(path).read_bytes() == b"#!/bin/sh\n"


# --- commits ---------------------------------------------------------------------------------

def test_regular_and_lfs_files_commit_and_list_with_their_oids(api: HfApi, repo: str,
                                                               tmp_path: Path) -> None:
    text, small_binary, big = b"hello\n", b"\x00\x01\xff" * 10, os.urandom(2 * MiB + 3)
    (tmp_path / "big.bin").write_bytes(big)
    parent = head(api)
    ops = [CommitOperationAdd("out/hello.txt", text),
           CommitOperationAdd("out/raw.dat", small_binary),
           CommitOperationAdd("out/deep/big.bin", str(tmp_path / "big.bin"))]
    oid = api.create_commit(repo, ops, commit_message="outputs", repo_type="dataset",
                            parent_commit=parent).oid
    assert [op._upload_mode for op in ops] == ["regular", "lfs", "lfs"]
    assert head(api) == oid and len(oid) == 40

    tree = {e.path: e for e in api.list_repo_tree(repo, repo_type="dataset", recursive=True,
                                                  revision=oid)}
    assert sorted(tree) == [".gitattributes", "out", "out/deep", "out/deep/big.bin",
                            "out/hello.txt", "out/raw.dat"]
    hello = tree["out/hello.txt"]
    assert hello.blob_id == git_blob(text) and hello.size == 6 and hello.lfs is None  # type: ignore[union-attr]
    big_entry = tree["out/deep/big.bin"]
    assert big_entry.size == len(big)  # type: ignore[union-attr]
    lfs = big_entry.lfs  # type: ignore[union-attr]
    assert lfs is not None and lfs.sha256 == hashlib.sha256(big).hexdigest()
    pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{lfs.sha256}\n"
               f"size {len(big)}\n").encode()
    assert lfs.pointer_size == len(pointer) and big_entry.blob_id == git_blob(pointer)  # type: ignore[union-attr]

    top = [e.path for e in api.list_repo_tree(repo, repo_type="dataset", revision=oid)]
    assert top == [".gitattributes", "out"]
    under = [e.path for e in api.list_repo_tree(repo, "out", repo_type="dataset", revision=oid)]
    assert under == ["out/deep", "out/hello.txt", "out/raw.dat"]

    deleted = api.create_commit(repo, [CommitOperationDelete("out/deep/")], commit_message="rm",
                                repo_type="dataset", parent_commit=oid).oid
    after = [e.path for e in api.list_repo_tree(repo, repo_type="dataset", recursive=True,
                                                 revision=deleted)]
    assert after == [".gitattributes", "out", "out/hello.txt", "out/raw.dat"]
    assert [c.title for c in api.list_repo_commits(repo, repo_type="dataset")] == [
        "rm", "outputs", "initial commit"]


def test_a_commit_on_a_stale_parent_is_refused_with_412(api: HfApi, repo: str) -> None:
    stale = head(api)
    moved = commit(api, {"a.txt": b"first\n"}, parent=stale)
    with pytest.raises(HfHubHTTPError) as exc:
        commit(api, {"a.txt": b"second\n"}, parent=stale)
    assert status_of(exc) == 412
    assert head(api) == moved
    assert commit(api, {"a.txt": b"second\n"}, parent=moved) == head(api)


def test_paths_info_gives_sizes_lfs_sha256_and_the_last_commit_that_changed_each(
        api: HfApi, repo: str) -> None:
    big = os.urandom(MiB + 1)
    first = commit(api, {"keep.txt": b"same\n", "d/big.bin": big}, "first")
    second = commit(api, {"d/other.txt": b"new\n"}, "second")
    infos = api.get_paths_info(repo, ["keep.txt", "d/big.bin", "d", "nope.txt"],
                               repo_type="dataset", revision=second, expand=True)
    by_path = {i.path: i for i in infos}
    assert sorted(by_path) == ["d", "d/big.bin", "keep.txt"]  # a missing path is left out
    big_info = by_path["d/big.bin"]
    assert big_info.lfs is not None and big_info.lfs.sha256 == hashlib.sha256(big).hexdigest()  # type: ignore[union-attr]
    last = {p: i.last_commit.oid for p, i in by_path.items() if i.last_commit}
    assert last == {"keep.txt": first, "d/big.bin": first, "d": second}
    # at the first commit, the second one's file is not there
    assert [i.path for i in api.get_paths_info(repo, ["d/other.txt"], repo_type="dataset",
                                               revision=first)] == []


# --- downloads -------------------------------------------------------------------------------

def test_download_at_a_commit_sha_serves_that_commits_bytes(api: HfApi, hub: HubServer,
                                                            repo: str, tmp_path: Path) -> None:
    old, new = os.urandom(MiB + 5), os.urandom(MiB + 7)
    c1 = commit(api, {"w.bin": old, "n.txt": b"one\n"})
    c2 = commit(api, {"w.bin": new, "n.txt": b"two\n"})
    for rev, blob, text in ((c1, old, b"one\n"), (c2, new, b"two\n"), ("main", new, b"two\n")):
        cache = tmp_path / f"cache-{rev}"
        path = hf_hub_download(repo, "w.bin", repo_type="dataset", revision=rev, cache_dir=cache)
        assert Path(path).read_bytes() == blob
        path = hf_hub_download(repo, "n.txt", repo_type="dataset", revision=rev, cache_dir=cache)
        assert Path(path).read_bytes() == text
    headers = {"Authorization": f"Bearer {TOKEN}"}
    meta = httpx.head(f"{hub.url}/datasets/{repo}/resolve/{c1}/w.bin", headers=headers)
    assert meta.status_code == 200 and meta.headers["x-repo-commit"] == c1
    assert meta.headers["x-linked-etag"] == f'"{hashlib.sha256(old).hexdigest()}"'
    assert meta.headers["x-linked-size"] == meta.headers["content-length"] == str(len(old))
    assert not [h for h in meta.headers if h.lower().startswith("x-xet")]
    part = httpx.get(f"{hub.url}/datasets/{repo}/resolve/{c1}/w.bin",
                     headers={**headers, "Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == old[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(old)}"


def test_snapshot_download_at_a_sha_verifies_and_a_changed_file_does_not(
        api: HfApi, repo: str, tmp_path: Path) -> None:
    oid = commit(api, {"a/x.txt": b"x\n", "a/y.bin": os.urandom(MiB + 9)})
    local = Path(snapshot_download(repo, repo_type="dataset", revision=oid,
                                   local_dir=tmp_path / "snap"))
    assert (local / "a" / "x.txt").read_bytes() == b"x\n"
    clean = api.verify_repo_checksums(repo, repo_type="dataset", revision=oid, local_dir=local)
    assert clean.checked_count == 3 and not clean.mismatches and not clean.missing_paths
    (local / "a" / "y.bin").write_bytes(b"tampered")
    dirty = api.verify_repo_checksums(repo, repo_type="dataset", revision=oid, local_dir=local)
    assert [m["path"] for m in dirty.mismatches] == ["a/y.bin"]


def test_missing_repo_revision_and_entry_are_404s_with_the_hubs_error_codes(
        api: HfApi, hub: HubServer, repo: str, tmp_path: Path) -> None:
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("fleet/nothing", repo_type="dataset")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(repo, repo_type="dataset", revision="0" * 40)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo, "absent.txt", repo_type="dataset", cache_dir=tmp_path / "c")
    r = httpx.head(f"{hub.url}/datasets/{repo}/resolve/main/absent.txt",
                   headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 404 and r.headers["x-error-code"] == "EntryNotFound"
    assert r.headers["x-repo-commit"] == head(api)


# --- uploads ---------------------------------------------------------------------------------

def test_an_lfs_upload_whose_bytes_are_not_the_announced_ones_is_refused(
        hub: HubServer, repo: str) -> None:
    data = os.urandom(4096)
    sha = hashlib.sha256(data).hexdigest()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    batch = httpx.post(f"{hub.url}/datasets/{repo}.git/info/lfs/objects/batch", headers=auth,
                       json={"operation": "upload", "transfers": ["basic"],
                             "objects": [{"oid": sha, "size": len(data)}]}).json()
    href = batch["objects"][0]["actions"]["upload"]["href"]
    wrong = httpx.put(href, content=b"\x00" + data[1:])
    assert wrong.status_code == 400 and "sha256" in wrong.json()["error"]
    assert not hub.store.has_object(sha, len(data))
    forged = httpx.put(href.replace(f"size={len(data)}", "size=1"), content=data[:1])
    assert forged.status_code == 403  # the signature covers the size
    assert httpx.put(href, content=data).status_code == 200
    assert hub.store.has_object(sha, len(data))
    again = httpx.post(f"{hub.url}/datasets/{repo}.git/info/lfs/objects/batch", headers=auth,
                       json={"operation": "upload", "objects": [{"oid": sha,
                                                                 "size": len(data)}]}).json()
    assert "actions" not in again["objects"][0]  # stored: nothing to upload


def test_malformed_requests_are_400s_not_server_errors(hub: HubServer, repo: str) -> None:
    with httpx.Client(base_url=hub.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        no_size = http.post(f"/api/datasets/{repo}/preupload/main",
                            json={"files": [{"path": "a.txt"}]})
        assert no_size.status_code == 400
        no_header = http.post(f"/api/datasets/{repo}/commit/main", content=b'{"key": "file"}\n')
        assert no_header.status_code == 400
        escape = http.post(f"/api/datasets/{repo}/commit/main", content=b"\n".join([
            json.dumps({"key": "header", "value": {"summary": "s"}}).encode(),
            json.dumps({"key": "file", "value": {"path": "../x", "content": "",
                                                 "encoding": "base64"}}).encode()]))
        assert escape.status_code == 400 and "invalid path" in escape.json()["error"]
        batch = http.post(f"/datasets/{repo}.git/info/lfs/objects/batch", json={
            "operation": "upload", "objects": [{"oid": "../" * 21 + "x", "size": 1}]}).json()
        assert batch["objects"][0]["error"]["code"] == 422


# --- persistence and auth --------------------------------------------------------------------

def test_repos_commits_and_objects_survive_a_restart(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    big = os.urandom(MiB + 11)
    with HubServer(tmp_path / "hub", TOKEN, poll_interval=0.01) as first:
        point_client(monkeypatch, first.url, tmp_path / "home")
        api = HfApi(endpoint=first.url, token=TOKEN)
        api.create_repo(REPO, repo_type="dataset")
        oid = commit(api, {"big.bin": big, "t.txt": b"t\n"})
    with HubServer(tmp_path / "hub", TOKEN, poll_interval=0.01) as second:
        point_client(monkeypatch, second.url, tmp_path / "home")
        api = HfApi(endpoint=second.url, token=TOKEN)
        assert head(api) == oid
        path = hf_hub_download(REPO, "big.bin", repo_type="dataset", revision=oid,
                               cache_dir=tmp_path / "fresh")
        assert Path(path).read_bytes() == big
        assert commit(api, {"t.txt": b"u\n"}, parent=oid) == head(api)


def test_every_route_wants_the_token_and_the_token_is_never_logged(
        hub: HubServer, api: HfApi, repo: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    routes = [("GET", f"/api/datasets/{repo}"), ("GET", f"/api/datasets/{repo}/tree/main"),
              ("POST", "/api/repos/create"), ("POST", f"/api/datasets/{repo}/commit/main"),
              ("HEAD", f"/datasets/{repo}/resolve/main/.gitattributes"),
              ("GET", "/_sandbox/faults")]
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            r = httpx.request(method, hub.url + path, headers=headers)
            assert r.status_code == 401, (method, path, headers)
    with pytest.raises(HfHubHTTPError) as exc:
        HfApi(endpoint=hub.url, token=False).repo_info(repo, repo_type="dataset")
    assert status_of(exc) == 401
    commit(api, {"a.txt": b"a\n"})
    mine = [r.getMessage() for r in caplog.records if r.name.startswith("sandbox")]
    assert mine and not [m for m in mine if TOKEN in m]


# --- faults ----------------------------------------------------------------------------------

def test_store_upload_refused_refuses_the_next_write_with_403_then_clears(
        api: HfApi, hub: HubServer, repo: str) -> None:
    before = head(api)
    hub.faults.add("store_upload_refused", count=1, repo=repo)
    with pytest.raises(HfHubHTTPError) as exc:
        commit(api, {"a.txt": b"a\n"})
    assert status_of(exc) == 403 and "store_upload_refused" in str(exc.value)
    assert head(api) == before and hub.faults.pending() == []
    assert commit(api, {"a.txt": b"a\n"}) == head(api)


def test_store_upload_refused_hits_lfs_uploads_and_only_its_repo(
        api: HfApi, hub: HubServer, repo: str) -> None:
    api.create_repo("fleet/other", repo_type="dataset")
    hub.faults.add("store_upload_refused", count=1, repo=repo)
    commit(api, {"x.bin": os.urandom(MiB + 1)}, repo="fleet/other")  # another repo: untouched
    with pytest.raises(HfHubHTTPError) as exc:
        commit(api, {"x.bin": os.urandom(MiB + 1)})
    assert status_of(exc) == 403 and exc.value.response is not None
    assert exc.value.response.url.path.endswith("/info/lfs/objects/batch")


def test_store_wrong_bytes_sends_other_bytes_of_the_same_length_under_the_right_headers(
        api: HfApi, hub: HubServer, repo: str, tmp_path: Path) -> None:
    data = os.urandom(MiB + 13)
    oid = commit(api, {"w.bin": data})
    url = f"{hub.url}/datasets/{repo}/resolve/{oid}/w.bin"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    good = httpx.get(url, headers=auth)
    hub.faults.add("store_wrong_bytes", count=1)
    bad = httpx.get(url, headers=auth)
    assert len(bad.content) == len(data) and bad.content != data
    strip = ("date",)
    assert {k: v for k, v in bad.headers.items() if k not in strip} == {
        k: v for k, v in good.headers.items() if k not in strip}
    hub.faults.add("store_wrong_bytes", count=1)
    path = hf_hub_download(repo, "w.bin", repo_type="dataset", revision=oid,
                           cache_dir=tmp_path / "cache")
    assert Path(path).read_bytes() != data  # the client takes it: only a read-back catches it
    assert httpx.get(url, headers=auth).content == data  # the fault is spent


def test_store_busy_answers_429_with_retry_after_and_the_client_asks_again(
        api: HfApi, hub: HubServer, repo: str, tmp_path: Path) -> None:
    data = os.urandom(MiB + 7)
    oid = commit(api, {"r.bin": data})
    hub.faults.add("store_busy", count=1)
    with httpx.Client(base_url=hub.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        blob = f"/datasets/{repo}/resolve/{oid}/r.bin"
        assert http.head(blob).status_code == 200  # a HEAD is not a download
        busy = http.get(blob)
    assert (busy.status_code, busy.headers["Retry-After"]) == (429, "1")
    assert "store_busy" in busy.json()["error"]
    hub.faults.add("store_busy", count=1)
    path = hf_hub_download(repo, "r.bin", repo_type="dataset", revision=oid,
                           cache_dir=tmp_path / "cache")
    assert Path(path).read_bytes() == data and hub.faults.pending() == []


def test_store_ghost_commit_answers_an_id_that_is_never_stored(api: HfApi, hub: HubServer,
                                                               repo: str) -> None:
    before = head(api)
    hub.faults.add("store_ghost_commit")
    ghost = commit(api, {"a.txt": b"ghost\n"}, parent=before)
    assert len(ghost) == 40 and ghost != before
    assert head(api) == before
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(repo, repo_type="dataset", revision=ghost)
    assert [c.commit_id for c in api.list_repo_commits(repo, repo_type="dataset")] == [before]


def test_faults_are_armed_listed_and_cleared_over_http(hub: HubServer) -> None:
    with httpx.Client(base_url=hub.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        armed = http.post("/_sandbox/faults", json={"kind": "store_wrong_bytes", "count": 2,
                                                    "repo": REPO}).json()["queued"]
        assert (armed["kind"], armed["count"], armed["repo"]) == ("store_wrong_bytes", 2, REPO)
        http.post("/_sandbox/faults", json={"kind": "store_ghost_commit"})
        listed = http.get("/_sandbox/faults").json()["faults"]
        assert [(f["kind"], f["repo"]) for f in listed] == [("store_wrong_bytes", REPO),
                                                            ("store_ghost_commit", None)]
        bad = http.post("/_sandbox/faults", json={"kind": "no_such_fault"})
        assert bad.status_code == 400 and "store_upload_refused" in bad.json()["error"]
        assert http.delete("/_sandbox/faults").json() == {"cleared": 2}
        assert http.get("/_sandbox/faults").json() == {"faults": []}


# --- started by `fleet sandbox up` -----------------------------------------------------------

def test_sandbox_up_runs_the_store_writes_its_environment_and_keeps_it_across_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / ".sandbox"
    config = tmp_path / "fleet.toml"
    config.write_text('[fleet]\ndaily_budget_usd = 10\n[roles.live]\nkind = "standing"\n'
                      'image = "img"\ndisk_gb = 20\n')
    try:
        info = manage.up(state, boot_delay=0.01)
        env = manage.load_env(state)
        assert env["HF_ENDPOINT"] == info["hub_url"]
        assert env["HF_ENDPOINT"].startswith("http://127.0.0.1:")  # no boxes' bridge: loopback
        assert env["HF_HUB_DISABLE_XET"] == env["HF_HUB_DISABLE_TELEMETRY"] == "1"
        token = env["HF_TOKEN"]
        assert json.loads((state / "keys.json").read_text())["hub"] == token
        point_client(monkeypatch, env["HF_ENDPOINT"], tmp_path / "home")
        api = HfApi(endpoint=env["HF_ENDPOINT"], token=token)
        api.create_repo(REPO, repo_type="dataset")
        kept = commit(api, {"a.txt": b"kept\n"})

        # `fleet sandbox fault store_ghost_commit` with no target: any repository
        cli = [str(Path(sys.executable).parent / "fleet"), "sandbox", "fault",
               "store_ghost_commit", "--count", "2"]
        run = subprocess.run(cli, capture_output=True, text=True, timeout=120, env={
            **os.environ, "FLEET_SANDBOX_DIR": str(state), "FLEET_CONFIG": str(config)})
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["queued"]["count"] == 2
        assert commit(api, {"b.txt": b"ghost\n"}) != kept and head(api) == kept
        armed = manage.fault(state, "store_upload_refused", REPO)["queued"]
        assert armed["repo"] == REPO
        with pytest.raises(manage.SandboxError, match="unknown fault kind 'store_meteor'"):
            manage.fault(state, "store_meteor", REPO)
        with ControlClient(info["control_url"]) as control:
            assert control.faults() == []  # nothing went to the providers either

        manage.down(state)
        again = manage.up(state, boot_delay=0.01)
        env2 = manage.load_env(state)
        assert again["pid"] != info["pid"] and env2["HF_TOKEN"] == token
        api2 = HfApi(endpoint=env2["HF_ENDPOINT"], token=token)
        point_client(monkeypatch, env2["HF_ENDPOINT"], tmp_path / "home")
        assert head(api2) == kept  # the store's disk outlives its daemon; faults do not
        assert commit(api2, {"c.txt": b"after\n"}) == head(api2)
        assert token not in (state / "daemon.log").read_text()
        assert token not in (state / "daemon.json").read_text()
    finally:
        manage.down(state)
