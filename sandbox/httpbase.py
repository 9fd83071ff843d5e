"""The small HTTP layer the three sandbox servers share: stdlib server, request/response values.

Each server is an `App` (request in, response out) on a `ThreadingHTTPServer` bound to
127.0.0.1. A `Response` may ask to drop the connection without answering (the create-timeout
fault) or to answer only after a delay.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]  # first value of each query parameter
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        """The body as JSON; an empty body reads as {}. Raises ValueError when malformed."""
        return json.loads(self.body) if self.body.strip() else {}

    def bearer(self) -> str | None:
        """The key from `Authorization: Bearer <key>`, else from `?api_key=`."""
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return self.query.get("api_key")


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without answering
    delay: float = 0.0  # answer only after this many seconds


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(obj).encode(), "application/json", headers or {})


def text_response(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    return Response(status, text.encode(), "text/plain; charset=utf-8", headers or {})


App = Callable[[Request], Response]


def _handler(app: App) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "sandbox"
        disable_nagle_algorithm = True  # headers and body go out in separate writes

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                resp = app(Request(self.command, url.path, query, headers, body))
            except Exception:  # a bug in a fake must show as a 500, not a hung client
                log.exception("sandbox handler failed: %s %s", self.command, url.path)
                resp = json_response(500, {"error": "sandbox internal error"})
            if resp.delay:
                time.sleep(resp.delay)
            if resp.drop:
                self.close_connection = True
                return
            try:
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.content_type)
                self.send_header("Content-Length", str(len(resp.body)))
                for name, value in resp.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(resp.body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeouts)
                self.close_connection = True

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class Server:
    """One app served on 127.0.0.1 from a background thread."""

    def __init__(self, app: App, port: int = 0, poll_interval: float = 0.1) -> None:
        self._httpd = _Server(("127.0.0.1", port), _handler(app))
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": poll_interval},
            name=f"sandbox-http-{self.port}", daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
