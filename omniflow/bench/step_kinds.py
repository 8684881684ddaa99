"""How many of a served stage's steps were decode steps and how many mixed, and how long
each kind took: the question the c128 runs raised, why a served 128-row step took several
times what the engine alone takes (docs/performance.md, "Steady state at c128").

A `PhaseTimer` that times only the whole-step phases (`decode_step`: every scheduled request
decodes, a window counted once; `mixed_step`: anything with a prefill; `audio_wait`: the wait
for a step's audio, which the runner leaves decoding when it returns) on the host clock,
without synchronising the device: each step ends with its codes read back to the host anyway,
so the wall time of a step is its real duration (its audio wait apart), and timing it
perturbs nothing. The other phases (plan_state, decode_layout, forward, prefill_layout,
prefill_embed, prefill, sample, readback, record, audio) are timed only with
`bench.phase_timing=device`, which synchronises the device around every phase (as
`benchmarks.talker_baseline` does): exact phases, slower steps.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

STEP_PHASES = ("decode_step", "mixed_step", "audio_wait")
"""Timed on the host clock always. `audio_wait`: the engine waiting for a step's audio after
the step returned (`worker/step_audio.py`); under sync scheduling a step's full duration is
its decode or mixed step plus its audio wait, under async the wait overlaps the next step
(with `bench.phase_timing=device` and async scheduling the wait's device synchronisation
also waits for that next step: read it under sync scheduling then)."""


class StepKindTimer:
    """Wall seconds of every decode and mixed step, per stage; with `sync` (a device
    synchronisation, `bench.phase_timing=device`) every phase, synchronised before and after
    so that each phase's device work is inside its own time."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.seconds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def phase(self, stage: str, name: str) -> AbstractContextManager[object]:
        if self.sync is None and name not in STEP_PHASES:
            return nullcontext()
        return self._timed(self.seconds[stage][name])

    def add(self, stage: str, name: str, seconds: float) -> None:
        """A phase timed by an engine in another process (host clock: the step phases)."""
        if self.sync is None and name not in STEP_PHASES:
            return
        self.seconds[stage][name].append(seconds)

    @contextmanager
    def _timed(self, into: list[float]) -> Iterator[None]:
        if self.sync is not None:
            self.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
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


def device_sync(device: str) -> Callable[[], None]:
    """Waits for the device's queued work (CUDA); a no-op elsewhere, where work is
    synchronous."""
    if device.startswith("cuda"):
        import torch  # imported only where a device needs it

        return lambda: torch.cuda.synchronize(device)
    return lambda: None
