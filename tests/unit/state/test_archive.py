"""The local archive: a tar stream received once, each byte hashed once as it is written."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from fleet.core import fileutil
from fleet.core.errors import FleetError
from fleet.state import archive


def tar_stream(files: dict[str, bytes], extra: list[tarfile.TarInfo] | None = None,
               sent: object = None) -> io.BytesIO:
    """The stream `python -m agent manifest --tar` sends: out/<path> members, then the box's
    manifest (of `files` unless `sent` says otherwise; "none" leaves it out)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"out/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info)
        if sent != "none":
            blob = json.dumps(manifest(files) if sent is None else sent).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    buf.seek(0)
    return buf


def manifest(files: dict[str, bytes]) -> list[dict[str, object]]:
    return [{"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
            for p, b in sorted(files.items())]


FILES = {"results.json": b'{"ok": 1}\n', "deep/samples.bin": bytes(range(256)) * 4000}


def test_a_matching_pull_becomes_the_archive_with_its_manifest(tmp_path: Path) -> None:
    pulled = archive.pull(tar_stream(FILES), tmp_path, "box-1", "job")
    assert pulled.problems == [] and pulled.files == 2 and pulled.manifest == manifest(FILES)
    assert pulled.path == tmp_path / "box-1" / "job" / "outputs"
    assert (pulled.path / "deep/samples.bin").read_bytes() == FILES["deep/samples.bin"]
    assert json.loads((pulled.path.parent / archive.MANIFEST).read_text()) == manifest(FILES)
    assert sorted(p.name for p in (tmp_path / "box-1").iterdir()) == ["job"]


def test_an_output_named_like_the_manifest_is_an_output(tmp_path: Path) -> None:
    files = {**FILES, archive.MANIFEST: b"mine, not the fleet's\n"}
    pulled = archive.pull(tar_stream(files), tmp_path, "box-1", "job")
    assert pulled.problems == [] and pulled.files == 3
    assert (pulled.path / archive.MANIFEST).read_bytes() == b"mine, not the fleet's\n"
    assert json.loads((pulled.path.parent / archive.MANIFEST).read_text()) == manifest(files)


def test_each_pull_lands_in_a_folder_of_its_own(tmp_path: Path) -> None:
    # two pulls of one job (a teardown from cron beside `fleet run`'s own) never share the
    # folder they land in: one cannot delete the other's copy or mix its files in
    first = tar_stream(FILES)
    landed: list[Path] = []
    real = archive.receive

    def receive(stream, dest: Path):  # type: ignore[no-untyped-def]
        landed.append(dest.parent)
        if len(landed) == 1:  # the second pull runs while the first is still receiving
            other = archive.pull(tar_stream({"other.txt": b"o"}), tmp_path, "box-1", "job")
            assert other.problems == [] and (other.path / "other.txt").exists()
        return real(stream, dest)

    archive.receive = receive  # type: ignore[assignment]
    try:
        pulled = archive.pull(first, tmp_path, "box-1", "job")
    finally:
        archive.receive = real  # type: ignore[assignment]
    assert landed[0] != landed[1]
    assert pulled.problems == [] and sorted(
        p.relative_to(pulled.path).as_posix() for p in pulled.path.rglob("*") if p.is_file()
    ) == sorted(FILES)


def test_each_differing_file_is_named_and_the_archive_left_alone(tmp_path: Path) -> None:
    archive.pull(tar_stream(FILES), tmp_path, "box-1", "job")
    changed = {**FILES, "results.json": b'{"ok": 2}\n', "late.txt": b"x"}
    want = manifest(FILES) + [{"path": "gone.txt", "size": 1, "sha256": "0" * 64}]
    pulled = archive.pull(tar_stream(changed, sent=want), tmp_path, "box-1", "job")
    text = "\n".join(pulled.problems)
    assert "results.json: the archive" in text and "sha256" in text
    assert "gone.txt: missing from the archive" in text
    assert "late.txt: in the archive" in text and "not in the box's manifest" in text
    # the verified copy from before is untouched; the bad pull's copy is gone (the box,
    # kept, still holds the outputs)
    assert (tmp_path / "box-1/job/outputs/results.json").read_bytes() == FILES["results.json"]
    assert sorted(p.name for p in (tmp_path / "box-1").iterdir()) == ["job"]


def test_a_link_or_a_fifo_in_the_outputs_is_named_and_nothing_becomes_the_archive(
        tmp_path: Path) -> None:
    # the box never follows nor sends them, but lists them: their outputs would be lost
    sent = manifest(FILES) + [{"path": "latest", "link": "results.json"},
                              {"path": "pipe", "special": "fifo"}]
    pulled = archive.pull(tar_stream(FILES, sent=sent), tmp_path, "box-1", "job")
    assert pulled.problems == [
        "latest: a link to results.json on the box, not a file (copy the file there in its "
        "place, or remove the link)", "pipe: a fifo on the box, not a file"]
    assert not (tmp_path / "box-1" / "job").exists()


def test_links_and_escaping_names_are_not_written(tmp_path: Path) -> None:
    link = tarfile.TarInfo("out/evil")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    up = tarfile.TarInfo("out/../escape.txt")
    pulled = archive.pull(tar_stream({}, [link, up]), tmp_path / "a", "box", "job")
    assert pulled.problems == [] and pulled.files == 0
    assert not (tmp_path / "a" / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()
    assert not (pulled.path / "evil").exists()


def test_every_byte_is_hashed_once(tmp_path: Path, monkeypatch) -> None:
    hashed = []
    real = hashlib.sha256

    class Counting:
        def __init__(self, data: bytes = b"") -> None:
            self.h = real(data)
            hashed.append(len(data))

        def update(self, data: bytes) -> None:
            hashed.append(len(data))
            self.h.update(data)

        def hexdigest(self) -> str:
            return self.h.hexdigest()

    stream = tar_stream(FILES)
    monkeypatch.setattr(archive.hashlib, "sha256", Counting)
    archive.pull(stream, tmp_path, "box", "job")
    assert sum(hashed) == sum(len(b) for b in FILES.values())


def test_a_stream_cut_short_or_a_file_written_while_read_is_a_problem(tmp_path: Path) -> None:
    cut = archive.pull(tar_stream(FILES, sent="none"), tmp_path, "box", "job")
    assert cut.problems == ["the box sent no manifest after its files (the stream was cut "
                            "short?)"]
    sent = [{**e, "changed": e["path"] == "results.json"} for e in manifest(FILES)]
    moving = archive.pull(tar_stream(FILES, sent=sent), tmp_path, "box", "job")
    assert moving.problems == ["results.json: written to on the box while it was read"]
    assert not (tmp_path / "box" / "job").exists()


def test_the_agents_stream_round_trips_and_reads_each_byte_once(tmp_path: Path,
                                                                 monkeypatch) -> None:
    from agent.base import manifest as agent_manifest

    out = tmp_path / "box" / "out"
    for rel, data in FILES.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    read: list[int] = []

    def counting_open(path, mode="r", **kw):  # type: ignore[no-untyped-def]
        f = open(path, mode, **kw)  # noqa: SIM115 (closed by the wrapper)
        return _Counted(f, read)

    # every file the agent's stream opens, counted as it is read
    monkeypatch.setattr(agent_manifest, "open", counting_open, raising=False)
    sent = io.BytesIO()
    saved = tmp_path / "box" / "saved.json"
    agent_manifest.stream(out, sent, saved)
    monkeypatch.undo()
    assert sum(read) == sum(len(b) for b in FILES.values())  # the box read each byte once
    sent.seek(0)
    pulled = archive.pull(sent, tmp_path / "archive", "box", "job")
    assert pulled.problems == [] and pulled.manifest == manifest(FILES)
    assert agent_manifest.unchanged_since(out, saved) == []
    (out / "results.json").write_bytes(b"late\n")
    (out / "new.txt").write_bytes(b"x")
    assert agent_manifest.unchanged_since(out, saved) == [
        "new.txt: new on the box since the outputs were read",
        "results.json: written to on the box after it was read (10 -> 5 bytes)"]


class _Counted:
    def __init__(self, f, read: list[int]) -> None:  # type: ignore[no-untyped-def]
        self._f, self._read = f, read

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._read.append(len(data))
        return data

    def readinto(self, buf) -> int:  # type: ignore[no-untyped-def]
        n = self._f.readinto(buf)
        self._read.append(n)
        return n

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        self._f.close()

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._f, name)


def test_make_durable_syncs_every_file_and_folder_of_the_archive(tmp_path: Path,
                                                                 monkeypatch) -> None:
    pulled = archive.pull(tar_stream(FILES), tmp_path, "box-1", "job")
    synced: list[str] = []
    real = fileutil.os.fsync

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(fileutil.os, "fsync", record)
    job = pulled.path.parent
    archive.make_durable(job)
    assert set(synced) == {str(job / "outputs/results.json"), str(job / "outputs/deep/samples.bin"),
                           str(job / archive.MANIFEST), str(job), str(job / "outputs"),
                           str(job / "outputs/deep"), str(job.parent)}


def test_a_disk_that_cannot_sync_is_an_error(tmp_path: Path, monkeypatch) -> None:
    pulled = archive.pull(tar_stream(FILES), tmp_path, "box-1", "job")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileutil.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        archive.make_durable(pulled.path)


def test_long_names_and_a_stream_cut_anywhere(tmp_path: Path) -> None:
    deep = "d/" * 80 + "results.bin"  # past ustar's 100 bytes: a PAX header carries it
    files = {deep: b"x" * 700, "small.txt": b"y"}
    pulled = archive.pull(tar_stream(files), tmp_path / "a", "box", "job")
    assert pulled.problems == [] and (pulled.path / deep).read_bytes() == b"x" * 700
    whole = tar_stream(files).getvalue()
    first = 3 * tarfile.BLOCKSIZE + 1024  # the PAX header, the file's header, its two blocks
    between = archive.pull(io.BytesIO(whole[:first]), tmp_path / "b", "box", "job")
    assert between.problems == ["the box sent no manifest after its files (the stream was "
                                "cut short?)"]
    for cut in (first - 100, first + 10):  # inside a file, inside a header
        with pytest.raises(FleetError, match="ended"):
            archive.pull(io.BytesIO(whole[:cut]), tmp_path / f"c{cut}", "box", "job")


def left_in(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def test_a_pull_cut_inside_a_file_leaves_no_partial_copy(tmp_path: Path) -> None:
    whole = tar_stream(FILES).getvalue()
    with pytest.raises(FleetError, match="ended"):
        archive.pull(io.BytesIO(whole[:2 * tarfile.BLOCKSIZE + 100]), tmp_path, "box-1", "job")
    assert left_in(tmp_path / "box-1") == []


def test_a_pull_onto_a_full_disk_leaves_no_partial_copy_and_the_last_verified_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive.pull(tar_stream(FILES), tmp_path, "box-1", "job")
    written: list[int] = []
    real = archive.DirectWriter.write

    def fills_up(self, data) -> None:  # type: ignore[no-untyped-def]
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(len(data))
        real(self, data)

    monkeypatch.setattr(archive.DirectWriter, "write", fills_up)
    with pytest.raises(FleetError, match="No space left"):
        archive.pull(tar_stream(FILES), tmp_path, "box-1", "job")
    assert left_in(tmp_path / "box-1") == ["job"]
    assert (tmp_path / "box-1/job/outputs/results.json").read_bytes() == FILES["results.json"]


def test_a_pull_killed_by_its_caller_leaves_no_partial_copy(tmp_path: Path) -> None:
    class Interrupted(io.BytesIO):
        def readinto(self, b):  # type: ignore[no-untyped-def,override]
            if self.tell() > 2 * tarfile.BLOCKSIZE:
                raise KeyboardInterrupt
            return super().readinto(b)

    with pytest.raises(KeyboardInterrupt):
        archive.pull(Interrupted(tar_stream(FILES).getvalue()), tmp_path, "box-1", "job")
    assert left_in(tmp_path / "box-1") == []
