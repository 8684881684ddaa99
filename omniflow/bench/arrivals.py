"""When an open-loop run's requests arrive: seeded, so a run's arrivals can be made again.

`poisson`: independent arrivals at a mean rate (exponential gaps, drawn from Python's
`random.Random(seed)`, the same list on every machine and Python version that keeps its
Mersenne Twister); `constant`: one every 1/rate seconds, the first at 0. One seed at two
rates gives the same arrivals on two time scales (each gap is a seeded draw over the rate),
so a sweep over `bench.rps` compares rates on one pattern of bursts and lulls.
"""

from __future__ import annotations

import random
from typing import Literal

Arrivals = Literal["poisson", "constant"]
KINDS: tuple[Arrivals, ...] = ("poisson", "constant")


def arrival_times(
    rate: float, until_s: float, kind: Arrivals = "poisson", seed: int = 0
) -> list[float]:
    """Arrival times in seconds from the run's start, in order, every one before `until_s`."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if kind == "constant":
        n = int(until_s * rate)  # arrivals at 0, 1/rate, ... below until_s
        times = [i / rate for i in range(n + 1)]
        return [t for t in times if t < until_s]
    if kind != "poisson":
        raise ValueError(f"unknown arrivals {kind!r}; known: {list(KINDS)}")
    rng = random.Random(seed)
    times = []
    t = rng.expovariate(rate)
    while t < until_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times
