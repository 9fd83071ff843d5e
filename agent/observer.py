"""The observer: probes every program each tick and re-checks admission each reconcile, in a
background thread, so that a hung node or a slow driver never delays the supervision loop.

`readings` and `admission` are replaced whole, so readers need no lock. The thread survives any
one failure (each probe, and each round, is caught); should it end anyway, the supervisor sees
`is_alive()` false at its next tick, starts a new one and reports the restart. Readings carry
their time, so a frozen observer shows as old readings, which every reader treats as unknown.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

from agent.config import Config
from agent.gpu import Admission
from agent.probes import Reading, probe_program
from agent.template import Values


class Observer(threading.Thread):
    def __init__(self, cfg: Config, values: Callable[[str], Values],
                 check_admission: Callable[[], Admission], admission: Admission,
                 readings: dict[str, Reading] | None = None,
                 interval: Callable[[], float] | None = None) -> None:
        super().__init__(name="observer", daemon=True)
        self.cfg = cfg
        self.values = values
        self.check_admission = check_admission
        self.readings: dict[str, Reading] = dict(readings or {})
        self.admission = admission
        self.interval = interval or (lambda: cfg.tick_s)  # shorter while a switch awaits sync
        self.round_at: float | None = None  # wall time of the last complete round
        self.last_error: str | None = None
        self._next_admission = time.monotonic() + cfg.reconcile_s
        self._halt = threading.Event()
        self._wake = threading.Event()  # a round now, not after the interval

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                try:
                    self._round()
                except Exception as e:  # never the end of the thread
                    self.last_error = f"{type(e).__name__}: {e}"
                self._wake.wait(self.interval())
                self._wake.clear()
        except BaseException as e:
            self.last_error = "".join(traceback.format_exception_only(e)).strip()
            raise

    def _round(self) -> None:
        readings = {}
        for name, program in self.cfg.programs.items():
            readings[name] = probe_program(program, self.values(name))
        self.readings = readings
        if time.monotonic() >= self._next_admission:
            self.admission = self.check_admission()
            self._next_admission = time.monotonic() + self.cfg.reconcile_s
        self.round_at = time.time()

    def poke(self) -> None:
        """Probe now (a switch's new node has started: its first synced answer is timed)."""
        self._wake.set()

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
