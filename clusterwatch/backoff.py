"""Exponential backoff: how long to wait before trying again something that keeps failing.

One shape for every retry (the agent's stream to its collector, scontrol calls, the Slurm registry's
passes): a first wait, grown by a factor after each failure up to a cap, each wait drawn with jitter
so that many clients (a thousand agents, several collectors) do not retry in lockstep.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Waits of `initial_s`, then `factor` times the last, at most `cap_s`; each one drawn uniformly
    between `jitter[0]` and `jitter[1]` times that (the default: no jitter)."""

    initial_s: float
    cap_s: float
    factor: float = 2.0
    jitter: tuple[float, float] = (1.0, 1.0)
    delay_s: float = field(init=False)  # the next wait, before jitter

    def __post_init__(self) -> None:
        self.delay_s = min(self.initial_s, self.cap_s)

    def next_wait(self) -> float:
        """The wait before the next try (jittered); the one after it grows by the factor, up to the cap."""
        low, high = self.jitter
        wait = self.delay_s if low == high == 1.0 else self.delay_s * random.uniform(low, high)
        self.delay_s = min(self.delay_s * self.factor, self.cap_s)
        return wait

    def reset(self, delay_s: float | None = None) -> None:
        """Start afresh (it worked a while): from the initial wait, or from `delay_s` (below the cap)."""
        self.delay_s = min(self.initial_s if delay_s is None else delay_s, self.cap_s)

    def after(self, failures: int) -> float:
        """The wait after `failures` consecutive failures (none: the initial wait), without jitter."""
        try:
            return min(self.initial_s * self.factor ** failures, self.cap_s)
        except OverflowError:  # a days-long outage: factor ** failures is past a float long before
            return self.cap_s
