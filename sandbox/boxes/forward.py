"""Public ports: userspace TCP forwarding from `public_ip:public_port` to `box_ip:port`.

Providers map a container's ports to ports on the machine's public address; here one asyncio
loop in a daemon thread does it for every box. Listening sockets are bound by the caller, so a
port is taken (or refused) before the box is reported, and closing a mapping drops its live
connections as a dead host would. A cut mapping keeps its port but drops every connection at
once, its live ones included, as a proxy in front of the box that is down would.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import threading
from dataclasses import dataclass, field

from sandbox.boxes.errors import BoxError

log = logging.getLogger(__name__)

PORT_RANGE = range(10000, 60000)
_CHUNK = 1 << 20  # an SSH stream of a GiB moves in few, large steps


def bind(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass(eq=False)
class Mapping:
    public: tuple[str, int]
    target: tuple[str, int]
    cut: bool = False  # every connection is dropped at once
    server: asyncio.AbstractServer | None = None
    conns: set[asyncio.Task[None]] = field(default_factory=set)


class PortAllocator:
    """Hands out public ports round-robin over `PORT_RANGE`, skipping ports already bound."""

    def __init__(self) -> None:
        self._next = PORT_RANGE.start
        self._lock = threading.Lock()

    def take(self, address: str) -> tuple[int, socket.socket]:
        with self._lock:
            for _ in PORT_RANGE:
                port = self._next
                self._next = port + 1 if port + 1 < PORT_RANGE.stop else PORT_RANGE.start
                try:
                    return port, bind(address, port)
                except OSError as e:
                    if e.errno != errno.EADDRINUSE:
                        raise BoxError(f"cannot listen on {address}:{port}: {e}") from e
        raise BoxError(f"no free public port left on {address}")


class Forwarder:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="box-forwarder", daemon=True
        )
        self._thread.start()

    def open(self, sock: socket.socket, target: tuple[str, int], cut: bool = False) -> Mapping:
        """Serve connections on a bound, listening `sock` by piping them to `target`."""
        host, port = sock.getsockname()[:2]
        mapping = Mapping((host, port), target, cut)
        try:
            asyncio.run_coroutine_threadsafe(self._serve(mapping, sock), self._loop).result()
        except BaseException:
            sock.close()
            raise
        return mapping

    def close_mapping(self, mapping: Mapping) -> None:
        """Stop listening and drop the mapping's live connections."""
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._close(mapping), self._loop).result()

    def set_cut(self, mapping: Mapping, cut: bool) -> None:
        """Cut the mapping (its live connections dropped too), or let connections through."""
        if not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._set_cut(mapping, cut), self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def _all() -> None:
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(_all(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _serve(self, mapping: Mapping, sock: socket.socket) -> None:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if mapping.cut:
                writer.transport.abort()
                return
            task = asyncio.current_task()
            assert task is not None
            mapping.conns.add(task)
            try:
                await _pipe(reader, writer, mapping.target)
            except asyncio.CancelledError:
                pass  # the mapping closed; asyncio's streams would log a cancelled handler
            finally:
                mapping.conns.discard(task)

        mapping.server = await asyncio.start_server(accept, sock=sock, limit=_CHUNK)

    async def _close(self, mapping: Mapping) -> None:
        if mapping.server is not None:
            mapping.server.close()
            mapping.server = None
        await self._drop(mapping)

    async def _set_cut(self, mapping: Mapping, cut: bool) -> None:
        mapping.cut = cut
        if cut:
            await self._drop(mapping)

    @staticmethod
    async def _drop(mapping: Mapping) -> None:
        """Drop the mapping's live connections."""
        conns = list(mapping.conns)
        for task in conns:
            task.cancel()
        await asyncio.gather(*conns, return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                target: tuple[str, int]) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection(*target, limit=_CHUNK)
    except OSError as e:
        log.info("forward to %s:%s: %s", *target, e)
        writer.transport.abort()  # the box is not listening (yet): refuse, as its port would
        return
    try:
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
    except asyncio.CancelledError:  # the mapping closed or was cut: the path is gone
        writer.transport.abort()
        up_writer.transport.abort()
        raise
    writer.close()  # flushes what is buffered, then closes
    up_writer.close()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(_CHUNK):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()  # half-close: the other direction keeps flowing
    except OSError:
        dst.transport.abort()
