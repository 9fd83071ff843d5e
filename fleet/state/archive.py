"""The local archive of one-shot outputs: pulled from the box as one tar stream, each file
hashed while it is written (its bytes are never read a second time), then compared with the
manifest the box made of the same bytes as it sent them (`python -m agent manifest --tar`:
`out/<path>` members, then `manifest.json`).

Layout: `<archive>/<label>/<job>/` holds `outputs/` (the outputs) and `fleet-manifest.json`
(the box's manifest), which no output's name can reach. A pull lands in a sibling
`.incoming.<random>.<job>` folder of its own first and replaces the archive only once every
file matched, so an archive folder is always a verified copy; a pull that fails, is stopped or
differs removes its incoming folder before it returns (the box, kept, still holds the
outputs), so a full disk is not left full. The copy it replaces waits in
`.previous.<random>.<job>` until the new one is durable (`make_durable`), and is put back if a
pull was killed between the two renames. The teardown holds the label's lock around a pull;
an incoming folder a killed process left behind is removed at the next pull.

The files are written by direct I/O (`lowio.directio`), past the page cache: the push reads them
once more the same way, and nothing else reads them soon. A pull is not durable by itself
(each file's last partial block, its size and its folder the kernel writes back later), and
`make_durable` (fsync of every file and folder) is the last step before the box is
destroyed. Syncing each file as it arrived would stall the stream for no gain, since the
box still holds the outputs until that last step.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from fleet.core import fileutil
from fleet.core.errors import FleetError
from lowio.directio import DirectWriter

MANIFEST = "fleet-manifest.json"
OUTPUTS = "outputs"  # the outputs' folder, beside the manifest (archive and store alike)
CHUNK = 1 << 20
OUT_PREFIX = "out/"  # the stream's outputs; its manifest member is STREAM_MANIFEST
STREAM_MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20


@dataclass
class Pulled:
    path: Path  # the verified outputs folder (where it would be, when problems)
    files: int
    bytes: int
    problems: list[str]
    manifest: list[dict[str, Any]]  # the box's: path, size, sha256 of each file it sent
    # every problem is an output that is not a file (a link, a fifo): a pull again would find
    # the same until someone changes the outputs on the box
    lasting: bool = False


def _member_path(name: str) -> str | None:
    p = PurePosixPath(name)
    parts = [x for x in p.parts if x not in (".", "")]
    if not parts or p.is_absolute() or ".." in parts:
        return None
    return "/".join(parts)


def receive(stream: IO[bytes], dest: Path) -> tuple[dict[str, dict[str, Any]], Any]:
    """Unpack a tar stream's output files into `dest`, hashing each as it is written:
    ({path: {size, sha256}}, the stream's manifest or None). Anything but regular files and
    folders is skipped.

    tarfile parses each header (`TarInfo.frombuf`; PAX and GNU long-name records are applied
    here), but the file bytes go from the stream into one reused buffer, then to the hash and
    the file: tarfile's own stream reader joins every chunk into new bytes, a second copy of
    the outputs that costs as much as hashing them."""
    got: dict[str, dict[str, Any]] = {}
    sent = None
    buf = memoryview(bytearray(CHUNK))
    for name, kind, size in _members(stream):
        if kind not in FILE_TYPES:
            _copy(stream, size, buf, None)
            continue
        if name == STREAM_MANIFEST and size <= MAX_MANIFEST_BYTES:
            sent = json.loads(_read_exact(stream, size))
            _skip_padding(stream, size)
            continue
        rel = _member_path(name[len(OUT_PREFIX):]) if name.startswith(OUT_PREFIX) else None
        if rel is None:
            _copy(stream, size, buf, None)
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with DirectWriter(target) as out:
            def sink(chunk: memoryview, h: Any = h, out: DirectWriter = out) -> None:
                h.update(chunk)
                out.write(chunk)

            _copy(stream, size, buf, sink)
        got[rel] = {"size": size, "sha256": h.hexdigest()}
    return got, sent


FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
BLOCK = tarfile.BLOCKSIZE


def _members(stream: IO[bytes]) -> Iterator[tuple[str, bytes, int]]:
    """(name, type, size) of each member; the caller consumes its data (`_copy`). Ends at the
    zero block that closes an archive, or where the stream ends between members; a stream
    ending inside a header or a file is an error."""
    pax: dict[str, str] = {}
    long_name: str | None = None
    while True:
        first = stream.read(BLOCK)
        if not first:
            return  # cut at a member's edge: the missing manifest tells (`_box_manifest`)
        block = first + _read_exact(stream, BLOCK - len(first))
        if block == tarfile.NUL * BLOCK:
            return
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME):
            data = _read_exact(stream, info.size)
            _skip_padding(stream, info.size)
            if info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = data.rstrip(tarfile.NUL).decode("utf-8", "surrogateescape")
            elif info.type == tarfile.XHDTYPE:
                pax = _pax_records(data)
            continue  # a global header (XGLTYPE) carries nothing the outputs need
        name = pax.get("path") or long_name or info.name
        size = int(pax["size"]) if "size" in pax else info.size
        pax, long_name = {}, None
        if size < 0:
            raise ValueError(f"{name}: negative size in its tar header")
        yield name, info.type, size


def _pax_records(data: bytes) -> dict[str, str]:
    """A PAX extended header's `LENGTH key=value\n` records."""
    out, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != tarfile.NUL:
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        if length <= space - pos or data[pos + length - 1:pos + length] != b"\n":
            raise ValueError("malformed PAX record in the tar stream")
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _copy(stream: IO[bytes], size: int, buf: memoryview,
          sink: Callable[[memoryview], Any] | None) -> None:
    """Exactly `size` bytes of member data through `buf` into `sink` (None: skipped), then
    the member's padding to the next block."""
    left = size
    while left:
        n = stream.readinto(buf[:min(left, len(buf))])  # type: ignore[attr-defined]
        if not n:
            raise ValueError("the tar stream ended inside a file")
        if sink is not None:
            sink(buf[:n])
        left -= n
    _skip_padding(stream, size)


def _skip_padding(stream: IO[bytes], size: int) -> None:
    _read_exact(stream, -size % BLOCK)


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n) if n else b""
    while len(data) < n:
        more = stream.read(n - len(data))
        if not more:
            raise ValueError("the tar stream ended early")
        data += more
    return data


def _box_manifest(sent: Any) -> tuple[list[dict[str, Any]], list[str], int]:
    """The stream's manifest as path/size/sha256 rows, what it says went wrong on the box
    (a file written to while it was read, no manifest at all: the stream was cut short), and
    how many of those are outputs that are not files (the first lines)."""
    if not isinstance(sent, list):
        return [], ["the box sent no manifest after its files (the stream was cut short?)"], 0
    others = [e for e in sent if _not_a_file(e)]
    try:
        rows = [{"path": str(e["path"]), "size": int(e["size"]), "sha256": str(e["sha256"])}
                for e in sent if not _not_a_file(e)]
    except (TypeError, KeyError, ValueError):
        return [], ["the box's manifest is malformed"], 0
    # a link or a fifo is never followed nor copied, so its output would be lost with the box
    problems = [f"{e['path']}: a link to {e['link']} on the box, not a file (copy the file "
                "there in its place, or remove the link)" if "link" in e else
                f"{e['path']}: a {e['special']} on the box, not a file" for e in others]
    return rows, problems + [f"{e['path']}: written to on the box while it was read"
                             for e in sent if e.get("changed")], len(problems)


def _not_a_file(entry: Any) -> bool:
    """A manifest entry for a link or a special file (`python -m agent manifest` lists them
    with `link` or `special`, and no size or sha256)."""
    return isinstance(entry, dict) and ("link" in entry or "special" in entry)


def compare(manifest: list[dict[str, Any]], got: dict[str, dict[str, Any]],
            where: str) -> list[str]:
    """One line per file that differs between the box's manifest and a copy at `where`."""
    problems = []
    want = {e["path"]: e for e in manifest}
    for path in sorted(want):
        e = want[path]
        have = got.get(path)
        if have is None:
            problems.append(f"{path}: missing from {where}")
        elif have["size"] != e["size"]:
            problems.append(f"{path}: {where} has {have['size']} bytes, the box's manifest says "
                            f"{e['size']}")
        elif have["sha256"] != e["sha256"]:
            problems.append(f"{path}: {where} has sha256 {have['sha256'][:16]}.., the box's "
                            f"manifest says {e['sha256'][:16]}..")
    for path in sorted(set(got) - set(want)):
        problems.append(f"{path}: in {where} but not in the box's manifest")
    return problems


def folder(archive: Path, label: str, job: str) -> Path:
    return archive / label / job


def make_durable(path: Path) -> None:
    """The archive folder on disk for good (its files, its folders and its own name), then
    the earlier copy it replaced gone; an OSError (a full disk, an I/O error) means the copy
    cannot be counted on."""
    fileutil.fsync_tree(path)
    for old in _leftovers(path.parent, PREVIOUS, path.name):
        shutil.rmtree(old)


INCOMING = ".incoming."  # `<prefix><random>.<job>`: a pull landing, or one kept or killed
PREVIOUS = ".previous."  # the verified copy a pull replaced, until the new one is durable


def _leftovers(parent: Path, prefix: str, job: str) -> list[Path]:
    """`parent`'s folders made by `_aside(prefix, job)` for exactly this job (mkdtemp's random
    part holds no dot, so the job's name is all that follows the first dot after it)."""
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if p.name.startswith(prefix)
                  and p.name[len(prefix):].partition(".")[2] == job)


def _aside(parent: Path, prefix: str, job: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, suffix=f".{job}", dir=parent))


def pull(stream: IO[bytes], archive: Path, label: str, job: str) -> Pulled:
    """Receive the outputs into the archive and verify them against the box's manifest. The
    caller holds the label's teardown lock."""
    final = folder(archive, label, job)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        _recover(final)
        for old in _leftovers(final.parent, INCOMING, job):  # a kept or killed pull's
            shutil.rmtree(old, ignore_errors=True)
        incoming = _aside(final.parent, INCOMING, job)
        (incoming / OUTPUTS).mkdir()
    except OSError as e:
        raise FleetError(f"{label}: cannot make room for the outputs in {final.parent}: "
                         f"{e}") from None
    try:
        return _land(stream, incoming, final, label, job)
    finally:  # a pull that failed, was stopped or differs leaves nothing behind
        shutil.rmtree(incoming, ignore_errors=True)


def _land(stream: IO[bytes], incoming: Path, final: Path, label: str, job: str) -> Pulled:
    """Receive into `incoming`, compare, and make it `final` when every file matched."""
    try:
        got, sent = receive(stream, incoming / OUTPUTS)
    except (tarfile.TarError, OSError, ValueError) as e:
        raise FleetError(f"{label}: pulling the outputs into {incoming} failed: {e}") from None
    manifest, problems, not_files = _box_manifest(sent)
    if manifest or not problems:  # without the box's manifest there is nothing to compare with
        problems += compare(manifest, got, f"the archive ({final})")
    total = sum(v["size"] for v in got.values())
    if problems:
        return Pulled(final / OUTPUTS, len(got), total, problems, manifest,
                      lasting=0 < not_files == len(problems))
    try:
        (incoming / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if final.exists():  # the verified copy before: kept aside until the new one is durable
            os.replace(final, _aside(final.parent, PREVIOUS, job) / job)
        os.replace(incoming, final)
    except OSError as e:
        raise FleetError(f"{label}: the verified copy in {incoming} could not become the "
                         f"archive ({e})") from None
    return Pulled(final / OUTPUTS, len(got), total, [], manifest)


def _recover(final: Path) -> None:
    """A pull killed between setting the verified copy aside and putting the new one in
    place left no archive folder: the copy set aside is put back."""
    if final.exists():
        return
    for old in reversed(_leftovers(final.parent, PREVIOUS, final.name)):
        if (old / final.name).is_dir():
            os.replace(old / final.name, final)
            shutil.rmtree(old)
            return
