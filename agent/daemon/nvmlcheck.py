"""Admission checks through NVML or AMD SMI, each in a thread of its own, so that a driver call
that hangs never holds up the supervision loop (nor the probes, nor the agent's start).

One check at a time: while one is in flight (maybe hung for good) no other starts, and the
verdict it would replace only ages; the freshness rule (freshness.py) makes an old verdict a
refusal. A thread stuck in a C call cannot be ended, only abandoned; it is a daemon thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from agent.base.gpu import Admission


class AdmissionChecks:
    def __init__(self, check: Callable[[], Admission], first: Admission) -> None:
        self.check = check
        self.verdict = first  # replaced whole by each finished check: readers need no lock
        self._thread: threading.Thread | None = None
        self._started = 0.0  # monotonic start of the check in flight

    def request(self) -> bool:
        """Start a check unless one is in flight; False when one is (it may be hung)."""
        if self.in_flight():
            return False
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="nvml", daemon=True)
        self._thread.start()
        return True

    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def in_flight_s(self) -> float:
        return time.monotonic() - self._started if self.in_flight() else 0.0

    def wait(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for the check in flight; True when none is left running."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.in_flight()

    def _run(self) -> None:
        self.verdict = self.check()  # admit() never raises: NVML failures are refusals
