"""What the Hub server's routes take and give: a parsed request, a reply, a file slice."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.hub.store import HubError


@dataclass
class Incoming:
    method: str
    segments: list[str]  # the path, split on "/" and unquoted one by one
    query: dict[str, list[str]]
    headers: Any  # email.message.Message: case-insensitive .get
    base_url: str  # scheme://host:port as the client addressed this server
    read_body: Callable[[], bytes]
    body_chunks: Callable[[], Iterator[bytes]]  # the body streamed, for uploads

    def arg(self, name: str, default: str = "") -> str:
        return self.query.get(name, [default])[0]

    def json(self) -> Any:
        try:
            return json.loads(self.read_body() or b"{}")
        except ValueError:
            raise HubError(400, "malformed JSON body") from None


@dataclass
class FileSlice:
    path: Path
    start: int
    length: int
    corrupt: bool = False  # the store_wrong_bytes fault: same length, other bytes


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    file: FileSlice | None = None

    @classmethod
    def json(cls, obj: Any, status: int = 200, content_type: str = "application/json",
             headers: dict[str, str] | None = None) -> Reply:
        return cls(status, {"Content-Type": content_type, **(headers or {})},
                   json.dumps(obj).encode())


def error_reply(exc: HubError) -> Reply:
    message = " ".join(exc.message.split()).encode("latin-1", "replace").decode("latin-1")
    headers = {"X-Error-Message": message, **exc.headers}
    if exc.code:
        headers["X-Error-Code"] = exc.code
    return Reply.json({"error": exc.message}, exc.status, headers=headers)


def is_true(value: str) -> bool:
    return value.lower() in ("1", "true", "yes")


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(start, length) of a single `bytes=` range; None to serve the whole file."""
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    try:
        if first:
            start = int(first)
            end = min(int(last), size - 1) if last else size - 1
        else:
            start, end = max(size - int(last), 0), size - 1
    except ValueError:
        return None
    if start >= size or end < start:
        raise HubError(416, f"range {header} outside 0-{size - 1}",
                       headers={"Content-Range": f"bytes */{size}"})
    return start, end - start + 1
