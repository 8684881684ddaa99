"""GPU: windows sized by playback slack give the codes of single steps (`window_k=0`) with the
decode and frame graphs on (pytest -m cuda).

One request at a time, so every step has the same rows in both runs (bf16 kernels that pick
their tiling by batch size see the same batches): windows change when tokens are read, not
what they are. The fake clock moves 15 ms per reading, so the slack cuts windows to
varying lengths below the cap of 8 (as on the CPU: 2, 4, 6 and 7 steps beside 8; at 60 ms
a reading every stream is late and no window opens)."""

from __future__ import annotations

import itertools

import pytest

from omniflow.sched.playback import PlaybackClock
from tests.factories import graphed_gpu_engine, speech
from tests.stages.test_talker_engine import collect

pytestmark = pytest.mark.cuda


def codes(window_k: int, tick_s: float | None) -> tuple[dict[str, list], object]:
    engine, proc = graphed_gpu_engine(window_k=window_k, async_scheduling=True)
    if tick_s is not None:
        ticks = itertools.count()
        engine.scheduler.playback = PlaybackClock(
            frame_s=0.08, margin_s=0.04, now=lambda: next(ticks) * tick_s
        )
    outputs = []
    for i, n in enumerate((40, 25)):  # one after the other: one row in every step
        req = speech(
            f"r{i}", text=f"Request number {i}.", seed=i, max_new_tokens=n, ignore_eos=True
        )
        engine.add_request(proc.make_request(req))
        outputs.extend(engine.run_until_idle())
    return collect(outputs), engine


def test_slack_sized_windows_give_the_single_step_codes_on_the_gpu():
    want, _ = codes(window_k=0, tick_s=None)
    got, engine = codes(window_k=8, tick_s=0.015)
    assert {rid: len(f) for rid, f in got.items()} == {"r0": 40, "r1": 25}
    sizes = engine.scheduler.window_stats.sizes
    assert len(set(sizes) - {8}) >= 2  # windows cut by the slack to several lengths
    assert got == want
