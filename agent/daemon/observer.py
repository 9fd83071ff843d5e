"""The observer: probes every program each tick in a background thread, so that a hung node
never delays the supervision loop. (Admission, through NVML, runs in threads of its own:
nvmlcheck.py.)

`readings` is replaced whole, so readers need no lock. The thread survives any one failure
(each probe, and each round, is caught), and every probe has a total deadline. Should the
thread end anyway, or its last round grow stale (stuck where no deadline reaches), the
supervisor starts a new one at its next tick and reports the restart. Readings carry their
monotonic time, so a frozen observer shows as old readings, which freshness.py makes unknown.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

from agent.base.config import Config
from agent.base.template import Values
from agent.daemon.probes import Reading, probe_program


class Observer(threading.Thread):
    def __init__(self, cfg: Config, values: Callable[[str], Values],
                 readings: dict[str, Reading] | None = None,
                 interval: Callable[[], float] | None = None) -> None:
        super().__init__(name="observer", daemon=True)
        self.cfg = cfg
        self.values = values
        self.readings: dict[str, Reading] = dict(readings or {})
        self.interval = interval or (lambda: cfg.tick_s)  # shorter while a switch awaits sync
        self.round_at: float | None = None  # wall time of the last complete round (display)
        self.round_mono = time.monotonic()  # monotonic: its start, then its last round's end
        self.last_error: str | None = None
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
        if self._halt.is_set():
            return  # abandoned while it was stuck: its readings are no one's any more
        self.readings = readings
        self.round_at, self.round_mono = time.time(), time.monotonic()

    def poke(self) -> None:
        """Probe now (a switch's new node has started: its first synced answer is timed)."""
        self._wake.set()

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
