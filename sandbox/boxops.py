"""Backend calls off the request threads, in order per box.

`backend.start` can take seconds with a real backend (a namespace, an sshd); the fake APIs must
keep answering meanwhile. Each box's operations run one after another (a destroy queued behind
a start waits for it) on a small shared pool; different boxes run in parallel.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


class BoxOps:
    def __init__(self, workers: int = 8) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox-box")
        self._queues: dict[str, deque[Callable[[], None]]] = {}
        self._cond = threading.Condition()

    def submit(self, box_id: str, op: Callable[[], None]) -> None:
        with self._cond:
            queue = self._queues.get(box_id)
            if queue is not None:  # busy: run after the ops already queued for this box
                queue.append(op)
                return
            self._queues[box_id] = deque()
        self._pool.submit(self._run, box_id, op)

    def _run(self, box_id: str, op: Callable[[], None]) -> None:
        while True:
            try:
                op()
            except Exception:  # a failing backend call must not stall the box's queue
                log.exception("backend operation for %s failed", box_id)
            with self._cond:
                queue = self._queues[box_id]
                if not queue:
                    del self._queues[box_id]
                    self._cond.notify_all()
                    return
                op = queue.popleft()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no operation is queued or running; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queues, timeout)

    def close(self) -> None:
        self.drain()
        self._pool.shutdown(wait=True)
