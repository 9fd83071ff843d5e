"""Crash-loop backoff: from `base`, doubling per consecutive short run, jittered, capped."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base_s: float = 1.0
    cap_s: float = 300.0
    jitter: float = 0.2  # +-20 %: programs that die together do not restart together

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before the next start after `failures` consecutive short runs (>= 1)."""
        nominal = min(self.cap_s, self.base_s * 2.0 ** min(max(failures, 1) - 1, 60))
        spread = (rng or random).uniform(1.0 - self.jitter, 1.0 + self.jitter)
        return min(self.cap_s, nominal * spread)
