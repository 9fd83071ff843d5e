"""The observer: each program's status source (the node's RPC, each status file) is probed by a
worker thread of its own, every tick, so that neither a hung node nor a hung status-file read
delays the supervision loop or any other probe. (Admission, through NVML, runs in threads of its
own: nvmlcheck.py.)

Each worker's `reading` is replaced whole, so readers need no lock. A worker survives any one
failure (each probe is caught), and every probe has a total deadline where one can be set (the
RPC's). A probe stuck where no deadline reaches (a read on a hung file system) holds only its own
worker: its reading ages and freshness.py makes it unknown, while the others go on. A stuck worker
is never replaced, so the threads stay bounded at one per program: when its probe returns, it
goes on probing. Should a worker's thread end anyway, the supervisor starts a new one for that
program at its next tick and reports the restart.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

from agent.base.config import Config, ProgramConfig
from agent.base.template import Values
from agent.daemon.probes import Reading, probe_program


class ProbeWorker(threading.Thread):
    """Probes one program every interval(), in this thread alone."""

    def __init__(self, program: ProgramConfig, values: Callable[[str], Values],
                 interval: Callable[[], float], reading: Reading | None = None) -> None:
        super().__init__(name=f"probe {program.name}", daemon=True)
        self.program = program
        self.values = values
        self.interval = interval
        self.reading = reading
        self.busy_since: float | None = None  # monotonic start of the probe in progress
        self.done_at: float | None = None  # wall time of the last probe that returned
        self.last_error: str | None = None
        self._halt = threading.Event()
        self._wake = threading.Event()  # a probe now, not after the interval

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self.busy_since = time.monotonic()
                reading = self._probe()
                self.busy_since = None
                if self._halt.is_set():
                    return  # stopped while it probed: its reading is no one's any more
                if reading is not None:
                    self.reading, self.done_at = reading, time.time()
                self._wake.wait(self.interval())
                self._wake.clear()
        except BaseException as e:
            self.last_error = "".join(traceback.format_exception_only(e)).strip()
            raise

    def _probe(self) -> Reading | None:
        try:
            return probe_program(self.program, self.values(self.program.name))
        except Exception as e:  # never the end of the thread
            self.last_error = f"{type(e).__name__}: {e}"
            return None

    def hung_s(self, now: float) -> float:
        """How long the probe in progress has run (0 when none is)."""
        since = self.busy_since
        return 0.0 if since is None else max(0.0, now - since)

    def poke(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()


class Observer:
    def __init__(self, cfg: Config, values: Callable[[str], Values],
                 readings: dict[str, Reading] | None = None,
                 interval: Callable[[], float] | None = None) -> None:
        self.cfg = cfg
        self.values = values
        self.interval = interval or (lambda: cfg.tick_s)  # shorter while a switch awaits sync
        old = readings or {}
        self.workers = {name: ProbeWorker(p, values, self.interval, old.get(name))
                        for name, p in cfg.programs.items()}

    @property
    def readings(self) -> dict[str, Reading]:
        return {name: w.reading for name, w in self.workers.items() if w.reading is not None}

    @property
    def round_at(self) -> float | None:
        """Wall time by which every probe had returned once more (display)."""
        times = [w.done_at for w in self.workers.values()]
        return None if not times or None in times else min(t for t in times if t is not None)

    @property
    def last_error(self) -> str | None:
        return next((w.last_error for w in self.workers.values() if w.last_error), None)

    def start(self) -> None:
        for w in self.workers.values():
            w.start()

    def is_alive(self) -> bool:
        return all(w.is_alive() for w in self.workers.values())

    def join(self, timeout: float | None = None) -> None:
        for w in self.workers.values():
            w.join(timeout)

    def hung(self, limit_s: float) -> dict[str, float]:
        """The programs whose probe has run longer than limit_s: how long."""
        now = time.monotonic()
        return {name: w.hung_s(now) for name, w in self.workers.items()
                if w.hung_s(now) > limit_s}

    def revive(self, values: Callable[[str], Values]) -> list[tuple[str, str]]:
        """A new worker, filled from `values`, for each whose thread ended (never for a stuck
        one: it is still alive, and bounded at one per program); (program, why) for each."""
        self.values = values
        ended = []
        for name, w in list(self.workers.items()):
            if w.is_alive():
                continue
            ended.append((name, w.last_error or "no error"))
            fresh = ProbeWorker(w.program, self.values, self.interval, w.reading)
            self.workers[name] = fresh
            fresh.start()
        return ended

    def poke(self) -> None:
        """Probe now (a switch's new node has started: its first synced answer is timed)."""
        for w in self.workers.values():
            w.poke()

    def stop(self) -> None:
        for w in self.workers.values():
            w.stop()
