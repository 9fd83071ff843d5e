"""The digest worker: the node releases the loop needs a sha256 of (the pointer's target, the
node binary before each start) are hashed by one thread of its own, so hashing a release of
hundreds of MiB never holds the supervision loop (a SIGKILLed miner's restart, a stop's
deadline, the heartbeat). The thread has a child process at the lowest CPU priority do the
hashing (files.DigestCache.hash_unchanged): hashing in the thread itself would hold the GIL.

The loop asks `lookup(path)` and gets the digest when it is known for the file as it is now
(one open and fstat: the cache is keyed by the file's identity, see files.DigestCache), or None
while it is not: the caller treats that as "not admitted" (the pointer is not applied, the node
is not started) and asks again later. The worker wakes the loop when a digest becomes known.

Settling: a file is hashed at once the first time it is asked for. One whose identity changed
since it was last seen (a copy still being written, a release replaced in place), or changed
while it was hashed, is hashed only once it has stayed the same for SETTLE_S on the monotonic
clock, so a copy in progress is not hashed again at every tick.

One thread, bounded: a hash stuck where no deadline reaches (a read on a hung file system)
holds only this worker, the digests it owes stay unknown (the node waits, fail closed) and it is
never replaced; a thread that ended is started again at the next lookup and counted.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from agent.base.files import MAX_PROGRAM_BYTES, DigestCache, identity, open_regular

SETTLE_S = 1.0  # how long a changed file must stay the same before it is hashed
SEEN_LIMIT = 64  # paths whose identity is remembered; the oldest go first


class DigestWorker:
    def __init__(self, cache: DigestCache, wake: Callable[[], None],
                 settle_s: float = SETTLE_S) -> None:
        self.cache = cache
        self._wake = wake  # called (from the worker's thread) once a hash is done
        self._settle_s = settle_s
        self._cond = threading.Condition()
        self._queue: dict[str, None] = {}  # paths to hash, in the order asked
        self._seen: dict[str, tuple[tuple[int, ...], float]] = {}  # identity, monotonic since
        self._settling: dict[str, float] = {}  # path: when it is due to be looked at again
        self._thread: threading.Thread | None = None
        self.busy: tuple[str, float] | None = None  # (path, monotonic start) of the hash now
        self.done = threading.Event()  # set after each hash; the loop clears it
        self.restarts = 0
        self.last_error: str | None = None

    def lookup(self, path: str) -> tuple[str | None, os.stat_result]:
        """(sha256, fstat) of the regular file at path, or (None, fstat) while its digest is
        not known yet (being hashed, or waiting for the file to settle). OSError for a file
        that cannot be one (see files.open_regular)."""
        fd, st = open_regular(path, MAX_PROGRAM_BYTES)
        os.close(fd)
        value = self.cache.known(st)
        if value is not None:
            return value, st
        key, now = identity(st), time.monotonic()
        with self._cond:
            seen = self._seen.get(path)
            if seen is None or seen[0] != key:
                self._see(path, key, now)
                due = seen is None  # first seen: at once; changed: once it settles
            else:
                due = now - seen[1] >= self._settle_s
            busy = self.busy
            if not due:
                self._settling[path] = self._seen[path][1] + self._settle_s
            elif path not in self._queue and (busy is None or busy[0] != path):
                self._settling.pop(path, None)
                self._queue[path] = None
                self._cond.notify()
        self._keep_thread()
        return None, st

    def known(self, path: str) -> str | None:
        """The digest of the file at path only if known already; nothing is hashed. OSError
        as lookup."""
        fd, st = open_regular(path, MAX_PROGRAM_BYTES)
        os.close(fd)
        return self.cache.known(st)

    def settles_at(self) -> float | None:
        """The monotonic time the first file waiting to settle is due to be asked for again
        (the loop wakes then: a long tick must not hold it back), or None."""
        with self._cond:
            return min(self._settling.values(), default=None)

    def take_settled(self, now: float) -> bool:
        """Whether a file waiting to settle is due now; each is told once (asking for it
        again puts it back if it changed meanwhile)."""
        with self._cond:
            due = [p for p, at in self._settling.items() if at <= now]
            for path in due:
                del self._settling[path]
        return bool(due)

    def hashing(self) -> tuple[str, float] | None:
        """(path, seconds so far) of the hash in progress, or None."""
        busy = self.busy
        return None if busy is None else (busy[0], time.monotonic() - busy[1])

    def _see(self, path: str, key: tuple[int, ...], now: float) -> None:
        self._seen.pop(path, None)
        if len(self._seen) >= SEEN_LIMIT:
            del self._seen[next(iter(self._seen))]
        self._seen[path] = (key, now)

    def _keep_thread(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        if thread is not None:
            self.restarts += 1
        self._thread = threading.Thread(target=self._run, name="digests", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._queue:
                        self._cond.wait()
                    path = next(iter(self._queue))
                    del self._queue[path]
                    self.busy = (path, time.monotonic())
                try:
                    self._hash(path)
                finally:
                    self.busy = None
                self.done.set()
                self._wake()
        except BaseException as e:
            self.last_error = "".join(traceback.format_exception_only(e)).strip()
            raise

    def _hash(self, path: str) -> None:
        try:
            changed = self.cache.hash_unchanged(Path(path))
        except OSError as e:  # the loop's own lookup tells why
            self.last_error = f"{path}: {e.strerror or e}"
            return
        if changed is not None:  # written to while hashed: again once it settles
            with self._cond:
                self._see(path, identity(changed), time.monotonic())
