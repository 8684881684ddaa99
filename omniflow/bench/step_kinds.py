"""How many of a served stage's steps were decode steps and how many mixed, and how long
each kind took: the question the c128 runs raised (a served 128-row step took 63-107 ms on
the H200 where the engine alone takes 15.8 ms; docs/benchmarks.md, "Steady state at c128").

A `PhaseTimer` that times only the whole-step phases (`decode_step`: every scheduled request
decodes, a window counted once; `mixed_step`: anything with a prefill) on the host clock,
without synchronising the device: each step ends with its codes read back to the host anyway,
so the wall time of a step is its real duration, and timing it perturbs nothing. The other
phases (forward, sample, audio) are not timed here (`bench.talker_baseline` times them with a
device synchronisation around each).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

STEP_PHASES = ("decode_step", "mixed_step")


class StepKindTimer:
    """Wall seconds of every decode and mixed step, per stage."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def phase(self, stage: str, name: str) -> AbstractContextManager[object]:
        if name not in STEP_PHASES:
            return nullcontext()
        return self._timed(self.seconds[stage][name])

    @contextmanager
    def _timed(self, into: list[float]) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            into.append(time.perf_counter() - t0)

    def summary(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per stage and kind: count, median and mean ms, total seconds."""
        return {
            stage: {
                kind: {
                    "count": len(xs),
                    "median_ms": 1e3 * statistics.median(xs),
                    "mean_ms": 1e3 * statistics.fmean(xs),
                    "total_s": sum(xs),
                }
                for kind, xs in kinds.items()
                if xs
            }
            for stage, kinds in self.seconds.items()
        }
