"""One deterministic tarball builder (fleet.core.tarball) for the agent bundle and the releases:
equal contents give equal bytes, whatever the order, the clock or the operator's user."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from fleet.boxes import deploy_support
from fleet.core.config import Config
from fleet.core.errors import ConfigError
from fleet.core.tarball import Entry, deterministic_tar
from sandbox.releases import build_store

ENTRIES = [Entry("b/two", b"2" * 3000, 0o755), Entry("a", b"1"), Entry("b/one", b"")]


def members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        return tar.getmembers()


@pytest.mark.parametrize("gz", [False, True])
def test_equal_contents_give_equal_bytes(gz: bool) -> None:
    one = deterministic_tar(ENTRIES, gzip=gz)
    assert one == deterministic_tar(list(reversed(ENTRIES)), gzip=gz)
    assert (one[:2] == b"\x1f\x8b") is gz
    if gz:
        assert one[4:8] == b"\0\0\0\0"  # gzip's header mtime
    infos = members(one)
    assert [i.name for i in infos] == ["a", "b/one", "b/two"]
    assert [i.mode for i in infos] == [0o644, 0o644, 0o755]
    assert all((i.mtime, i.uid, i.gid, i.uname, i.gname) == (0, 0, 0, "root", "root")
               for i in infos)
    with tarfile.open(fileobj=io.BytesIO(one), mode="r:*") as tar:
        f = tar.extractfile("b/two")
        assert f is not None and f.read() == b"2" * 3000


@pytest.mark.parametrize("name", ["/etc/passwd", "../up", "a/../../b", "", "a//b"])
def test_names_stay_inside_the_archive(name: str) -> None:
    with pytest.raises(ValueError, match="relative"):
        deterministic_tar([Entry(name, b"x")])


def test_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        deterministic_tar([Entry("a", b"1"), Entry("a", b"2")])


def test_release_tarballs_are_built_the_same_way(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "state" / "releases"
    build_store(store, ["1.4.0"])
    cfg = Config(path=tmp_path / "fleet.toml", registry=tmp_path / "state" / "boxes.json",
                 known_hosts=tmp_path / "kh", ssh_key=tmp_path / "key", releases=store,
                 daily_budget_usd=1.0, roles={}, roster=())
    monkeypatch.setattr(deploy_support, "config", lambda: cfg)
    (tmp_path / "state" / "cache").mkdir()
    build = deploy_support.release.__wrapped__  # type: ignore[attr-defined]
    shipped = build("1.4.0")
    data = shipped.tarball.read_bytes()
    assert data == deterministic_tar(
        [Entry(n, (store / "1.4.0" / n).read_bytes(), 0o755) for n in shipped.release.sha256])
    infos = members(data)
    assert [i.name for i in infos] == sorted(shipped.release.sha256)
    assert all(i.mode == 0o755 and i.mtime == 0 for i in infos)
    for line in shipped.sha256sums.splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((store / "1.4.0" / name).read_bytes()).hexdigest() == digest
    (store / "1.4.0" / "igneum-prover").write_bytes(b"tampered")
    with pytest.raises(ConfigError, match="igneum-prover does not match releases.json"):
        build("1.4.0")
