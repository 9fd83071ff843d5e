"""The local archive: a tar stream received once, each byte hashed once as it is written."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from fleet import archive


def tar_stream(files: dict[str, bytes], extra: list[tarfile.TarInfo] | None = None) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info)
    buf.seek(0)
    return buf


def manifest(files: dict[str, bytes]) -> list[dict[str, object]]:
    return [{"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
            for p, b in sorted(files.items())]


FILES = {"results.json": b'{"ok": 1}\n', "deep/samples.bin": bytes(range(256)) * 4000}


def test_a_matching_pull_becomes_the_archive_with_its_manifest(tmp_path: Path) -> None:
    pulled = archive.pull(tar_stream(FILES), manifest(FILES), tmp_path, "box-1", "job")
    assert pulled.problems == [] and pulled.files == 2
    assert pulled.path == tmp_path / "box-1" / "job"
    assert (pulled.path / "deep/samples.bin").read_bytes() == FILES["deep/samples.bin"]
    assert json.loads((pulled.path / archive.MANIFEST).read_text()) == manifest(FILES)
    assert not (tmp_path / "box-1" / ".incoming-job").exists()


def test_each_differing_file_is_named_and_the_archive_left_alone(tmp_path: Path) -> None:
    archive.pull(tar_stream(FILES), manifest(FILES), tmp_path, "box-1", "job")
    changed = {**FILES, "results.json": b'{"ok": 2}\n', "late.txt": b"x"}
    want = manifest(FILES) + [{"path": "gone.txt", "size": 1, "sha256": "0" * 64}]
    pulled = archive.pull(tar_stream(changed), want, tmp_path, "box-1", "job")
    text = "\n".join(pulled.problems)
    assert "results.json: the archive" in text and "sha256" in text
    assert "gone.txt: missing from the archive" in text
    assert "late.txt: in the archive" in text and "not in the box's manifest" in text
    # the verified copy from before is untouched; the bad pull waits beside it
    assert (tmp_path / "box-1/job/results.json").read_bytes() == FILES["results.json"]
    assert pulled.path == tmp_path / "box-1" / ".incoming-job"


def test_links_and_escaping_names_are_not_written(tmp_path: Path) -> None:
    link = tarfile.TarInfo("./evil")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    up = tarfile.TarInfo("../escape.txt")
    pulled = archive.pull(tar_stream({}, [link, up]), [], tmp_path / "a", "box", "job")
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

    want = manifest(FILES)
    monkeypatch.setattr(archive.hashlib, "sha256", Counting)
    archive.pull(tar_stream(FILES), want, tmp_path, "box", "job")
    assert sum(hashed) == sum(len(b) for b in FILES.values())
