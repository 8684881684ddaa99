"""GPU: a window that admits an arriving request (`window_admits`) gives the single-step
codes with the decode and frame graphs on (pytest -m cuda).

The arrival is timed so that every step has the same rows in both runs (the running request
alone until it has made FRAMES_BEFORE frames, then the two together), so bf16 kernels that
pick their tiling by batch size see the same batches: the admitting window's mixed first
step is the single-step run's mixed step, and its decode steps are that run's next steps."""

from __future__ import annotations

import pytest

from tests.factories import graphed_gpu_engine, speech
from tests.stages.test_talker_engine import collect

pytestmark = pytest.mark.cuda

FRAMES_BEFORE = 9
"""The running request's frames when the other arrives: its prefill's and two 4-frame
windows, so the arrival meets a window boundary in the windowed run."""


def codes(**engine_kw) -> tuple[dict[str, list], object]:
    engine, proc = graphed_gpu_engine(**engine_kw)
    engine.add_request(proc.make_request(speech("x", seed=3, max_new_tokens=30, ignore_eos=True)))
    outputs = []
    made = 0
    while made < FRAMES_BEFORE:
        step = engine.step()
        made += sum(len(o.tokens) for o in step if o.request_id == "x")
        outputs.extend(step)
    assert made == FRAMES_BEFORE
    late = speech("late", text="An arrival.", seed=4, max_new_tokens=12, ignore_eos=True)
    engine.add_request(proc.make_request(late))
    outputs.extend(engine.run_until_idle())
    return collect(outputs), engine


def test_an_admitting_window_gives_the_single_step_codes_on_the_gpu():
    want, _ = codes()
    got, engine = codes(window_k=4, window_admits=True)
    assert {rid: len(f) for rid, f in got.items()} == {"x": 30, "late": 12}
    assert engine.scheduler.window_stats.admitting_windows == 1
    assert got == want
