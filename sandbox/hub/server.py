"""`HubServer`: the Hub routes on a stdlib threading HTTP server, with bodies streamed.

Uploads are hashed on their way to disk and downloads are read from it in 1 MiB pieces, both by
direct I/O (`lowio.directio`), so a GiB never sits in memory (the shared `sandbox.httpbase` reads
and writes whole bodies). The request line is logged at debug level; headers (the token)
never are.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from lowio.directio import read_range
from sandbox.hub.faults import HubFaults
from sandbox.hub.routes import HubApp
from sandbox.hub.store import HubError, HubStore
from sandbox.hub.wire import FileSlice, Incoming, Reply

log = logging.getLogger(__name__)
CHUNK = 1 << 20
MAX_BODY = 1 << 30  # a JSON or ndjson body held in memory (regular files ride in commits)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sandbox-hub"
    disable_nagle_algorithm = True
    server: _HTTPServer

    def _serve(self) -> None:
        url = urlsplit(self.path)
        self._unread = int(self.headers.get("Content-Length") or 0)
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self._send(Reply.json({"error": "send a Content-Length"}, 411), close=True)
            return
        addr, port = self.server.server_address[:2]
        host = self.headers.get("Host") or f"{addr!s}:{port}"
        req = Incoming(
            method=self.command,
            segments=[unquote(s) for s in url.path.strip("/").split("/")],
            query=parse_qs(url.query, keep_blank_values=True),
            headers=self.headers, base_url=f"http://{host}",
            read_body=self._read_body, body_chunks=self._body_chunks,
        )
        try:
            reply = self.server.app(req)
        except ConnectionError:  # the client went away mid-upload
            self.close_connection = True
            return
        except Exception:  # a bug in the fake must show as a 500, not a hung client
            log.exception("hub handler failed: %s %s", self.command, url.path)
            reply = Reply.json({"error": "sandbox hub internal error"}, 500)
        # an unread body would be taken for the next request on this connection
        self._send(reply, close=self._unread > 0)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve

    def _read_body(self) -> bytes:
        if self._unread > MAX_BODY:
            raise HubError(413, "request body too large")
        data = self.rfile.read(self._unread)
        self._unread = 0
        return data

    def _body_chunks(self) -> Iterator[bytes]:
        while self._unread > 0:
            chunk = self.rfile.read(min(CHUNK, self._unread))
            if not chunk:
                raise ConnectionError("client closed the connection mid-body")
            self._unread -= len(chunk)
            yield chunk

    def _send(self, reply: Reply, close: bool = False) -> None:
        length = reply.file.length if reply.file else len(reply.body)
        try:
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(length))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if self.command == "HEAD":
                return
            if reply.file is not None:
                self._send_file(reply.file)
            else:
                self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):  # the client went away
            self.close_connection = True

    def _send_file(self, part: FileSlice) -> None:
        first = part.corrupt  # the store_wrong_bytes fault: the first byte sent, inverted
        for view in read_range(part.path, part.start, part.length):
            if first:
                self.wfile.write(bytes([view[0] ^ 0xFF]))
                view, first = view[1:], False
            self.wfile.write(view)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    app: HubApp


class HubServer:
    """A Hub-compatible store on `host:port` (port 0: any free one), from a background thread.

    + root: where repositories and objects persist (survives a restart)
    + token: the bearer token every request must carry (uploads use signed URLs instead)
    + host: a loopback or bridge address; never a public interface

    `faults` arms faults in-process; `/_sandbox/faults` does it over HTTP.
    """

    def __init__(self, root: Path, token: str, host: str = "127.0.0.1", port: int = 0,
                 poll_interval: float = 0.1) -> None:
        self.store = HubStore(root)
        self.faults = HubFaults()
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.app = HubApp(self.store, self.faults, token, secrets.token_bytes(32))
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": poll_interval},
            name=f"sandbox-hub-{self.port}", daemon=True,
        )
        self._thread.start()
        log.info("hub store at %s, data in %s", self.url, os.fspath(root))

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
