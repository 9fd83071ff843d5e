"""The store's direct I/O: every size round-trips (the unaligned tail included), ranges start
anywhere, and a filesystem without O_DIRECT gets ordinary I/O with the same bytes."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from lowio import directio
from lowio.directio import ALIGN, CHUNK, DirectWriter, read_range

SIZES = [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 4099]


def _write(path: Path, data: bytes, pieces: int = 7) -> None:
    """`data` handed over in pieces of uneven sizes, as a socket would."""
    cuts = sorted(random.Random(len(data)).sample(range(len(data) + 1), min(pieces, len(data))))
    with DirectWriter(path) as out:
        last = 0
        for cut in [*cuts, len(data)]:
            out.write(data[last:cut])
            last = cut


def _read(path: Path, start: int, length: int) -> bytes:
    return b"".join(bytes(v) for v in read_range(path, start, length))


@pytest.mark.parametrize("size", SIZES)
def test_every_size_round_trips(tmp_path: Path, size: int) -> None:
    data = random.Random(size).randbytes(size)
    path = tmp_path / "object"
    _write(path, data)
    assert path.read_bytes() == data
    assert _read(path, 0, size) == data


@pytest.mark.parametrize(("start", "length"), [(1, 10), (ALIGN - 1, 2), (4097, CHUNK),
                                               (CHUNK + 3, 2 * CHUNK), (0, 5 * CHUNK)])
def test_a_range_starts_anywhere_and_stops_at_the_end_of_the_file(
        tmp_path: Path, start: int, length: int) -> None:
    data = random.Random(1).randbytes(3 * CHUNK + 4099)
    path = tmp_path / "object"
    _write(path, data)
    assert _read(path, start, length) == data[start:start + length]


def test_a_filesystem_without_direct_io_gets_ordinary_io(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open, asked = os.open, []

    def no_direct(path: object, flags: int, *rest: int) -> int:
        asked.append(bool(flags & os.O_DIRECT))
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "direct I/O not supported")
        return real_open(path, flags, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(directio.os, "open", no_direct)
    data = random.Random(2).randbytes(CHUNK + 5)
    _write(tmp_path / "object", data)
    assert _read(tmp_path / "object", 3, CHUNK) == data[3:CHUNK + 3]
    assert asked == [True, False, True, False]


def test_a_writer_left_by_an_error_writes_nothing_more(tmp_path: Path) -> None:
    path = tmp_path / "object"
    with pytest.raises(RuntimeError), DirectWriter(path) as out:
        out.write(b"x" * (ALIGN + 1))
        raise RuntimeError("the client went away")
    assert path.read_bytes() == b""  # nothing was flushed; the caller removes the file
