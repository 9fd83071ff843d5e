"""A command over a box's master connection without starting `ssh`: OpenSSH's own mux protocol.

Starting the system's `ssh` costs the operator about 4 ms of CPU before it does anything (its
libraries and OpenSSL's start; bench/RESULTS.md), more than the rest of a reused read. The
master (`sshmux`) takes the same requests from any process on its socket: a hello, a new
session with its command, and the session's three stdio descriptors passed over the socket;
it answers with the session's opening and, at its end, the command's exit status. This speaks
exactly those messages and nothing else (no tty, no forwarding, no environment). Anything it
does not expect is a `MuxError`, and the caller runs the system's `ssh` instead.
"""

from __future__ import annotations

import os
import socket as socketlib
import struct
import time
from typing import IO

HELLO = 0x00000001
NEW_SESSION = 0x10000002
PERMISSION_DENIED = 0x80000002
FAILURE = 0x80000003
EXIT_MESSAGE = 0x80000004
SESSION_OPENED = 0x80000006
VERSION = 4
NO_ESCAPE = 0xFFFFFFFF
MAX_PACKET = 1 << 18  # the master's answers are a few words
HELLO_S = 5.0  # the master answers a hello itself, without the box: one that does not is hung


class MuxError(Exception):
    """The master is not there, or said something this does not speak."""


class NotOpened(MuxError):
    """The master took the request but the box did not open the session in time."""


def _u32(n: int) -> bytes:
    return struct.pack(">I", n)


def _string(b: bytes) -> bytes:
    return _u32(len(b)) + b


def _send(sock: socketlib.socket, *parts: bytes) -> None:
    sock.sendall(_string(b"".join(parts)))


def _recv_exactly(sock: socketlib.socket, n: int, deadline: float) -> bytes:
    got = bytearray()
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise MuxError("the master closed the connection")
        got += chunk
    return bytes(got)


def _recv(sock: socketlib.socket, deadline: float) -> tuple[int, bytes]:
    """One packet: its type and the rest of its body."""
    (size,) = struct.unpack(">I", _recv_exactly(sock, 4, deadline))
    if not 4 <= size <= MAX_PACKET:
        raise MuxError(f"a packet of {size} bytes")
    body = _recv_exactly(sock, size, deadline)
    return struct.unpack(">I", body[:4])[0], body[4:]


class Session:
    """One command running on the box: its output as `stdout` and `stderr` (read ends of
    pipes the master writes to), `kill` (drop it: the master closes its channel) and `wait`
    (its exit status; 255 where the master said none, as `ssh` says)."""

    def __init__(self, sock: socketlib.socket, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.sock, self.stdout, self.stderr = sock, stdout, stderr
        self.status: int | None = None

    def kill(self) -> None:
        self.sock.close()

    def wait(self, timeout: float = 5.0) -> int:
        deadline = time.monotonic() + timeout
        try:
            while self.status is None and self.sock.fileno() != -1:
                kind, body = _recv(self.sock, deadline)
                if kind == EXIT_MESSAGE and len(body) >= 8:
                    self.status = struct.unpack(">I", body[4:8])[0]
        except (MuxError, OSError, TimeoutError):
            pass
        finally:
            self.sock.close()
            self.stdout.close()
            self.stderr.close()
        return 255 if self.status is None else self.status


def open_session(socket: str, command: str, timeout: float) -> Session:
    """Run `command` on the box over the master at `socket`. MuxError where the master is
    not there or refuses; NotOpened where the box does not open the session within
    `timeout`."""
    deadline = time.monotonic() + timeout
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    fds: list[int] = []
    try:
        try:
            sock.settimeout(min(timeout, HELLO_S))
            sock.connect(socket)
            _send(sock, _u32(HELLO), _u32(VERSION))
            kind, body = _recv(sock, min(deadline, time.monotonic() + HELLO_S))
        except (OSError, TimeoutError) as e:
            raise MuxError(f"no master at {socket}: {e}") from None
        if kind != HELLO or body[:4] != _u32(VERSION):
            raise MuxError(f"the master's hello is {kind:#x}, version {body[:4].hex()}")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fds = [out_r, err_r]
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            _send(sock, _u32(NEW_SESSION), _u32(1), _string(b""), _u32(0), _u32(0), _u32(0),
                  _u32(0), _u32(NO_ESCAPE), _string(b""), _string(command.encode()))
            for fd in (null, out_w, err_w):  # one descriptor per message, as the master reads
                socketlib.send_fds(sock, [b"\0"], [fd])
        except OSError as e:
            raise MuxError(f"the master at {socket} did not take the session: {e}") from None
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        try:
            kind, body = _recv(sock, deadline)
        except TimeoutError:
            raise NotOpened(f"the session did not open within {timeout:g} s") from None
        except OSError as e:
            raise MuxError(f"the master at {socket} dropped the session: {e}") from None
        if kind in (PERMISSION_DENIED, FAILURE):
            said = body[8:8 + struct.unpack(">I", body[4:8])[0]] if len(body) >= 8 else b""
            raise MuxError(f"the master refused the session: {said.decode(errors='replace')}")
        if kind != SESSION_OPENED:
            raise MuxError(f"the master answered {kind:#x} to a session")
        session = Session(sock, os.fdopen(out_r, "rb", buffering=0),
                          os.fdopen(err_r, "rb", buffering=0))
        fds = []
        return session
    except BaseException:
        for fd in fds:
            os.close(fd)
        sock.close()
        raise
