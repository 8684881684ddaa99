"""Multi-step windows end to end on the tiny model: exactly the single-step tokens and audio."""

from __future__ import annotations

import numpy as np
import pytest

from tests.factories import Collector, build, eos_bundle, speech, stage_stats
from tests.stages.test_talker_engine import fixed, generate


@pytest.mark.parametrize("k", [2, 5, 12])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_window_codes_equal_single_step_at_concurrency_1(k, async_scheduling):
    req = [fixed("a", 23, seed=4)]
    base, _, _ = generate(req, async_scheduling=async_scheduling)
    win, _, engine = generate(req, async_scheduling=async_scheduling, window_k=k)
    assert win == base
    st = engine.scheduler.window_stats
    assert st.planned_windows > 0 and st.executed_windows > 0
    assert st.executed_steps > st.executed_windows  # several steps per window
    assert engine.scheduler.kv.num_used_blocks == 0


def test_window_codes_equal_single_step_for_same_length_requests():
    reqs = [fixed(f"r{i}", 17, seed=i, text=f"Same length {i}.") for i in range(4)]
    base, _, _ = generate(reqs)
    win, _, engine = generate(reqs, window_k=8)
    assert win == base
    assert engine.scheduler.window_stats.executed_windows > 0


def test_windows_respect_max_new_tokens_exactly():
    for n in (1, 2, 5, 9):
        frames, outputs, _ = generate([fixed("a", n)], window_k=8)
        assert len(frames["a"]) == n and outputs[-1].finish_reason == "length"


def test_windows_with_preemption_keep_the_codes():
    reqs = [fixed(f"r{i}", 14, seed=i, text="Preemption test sentence.") for i in range(3)]
    calm, _, _ = generate(reqs)
    squeezed, _, engine = generate(
        reqs, num_kv_blocks=12, block_size=4, max_model_len=48, window_k=4
    )
    assert engine.scheduler.num_preemptions > 0
    assert squeezed == calm


def test_eos_inside_a_window_stops_and_frees():
    import torch

    from omniflow.config.schema import SchedulerConfig
    from omniflow.models.qwen3_tts.ar_model import build_ar_model
    from omniflow.models.qwen3_tts.processor import TalkerProcessor
    from omniflow.sched.ar import ARScheduler
    from omniflow.stages.engine import StageEngine
    from omniflow.stages.runner import ARModelRunner

    bundle = eos_bundle()
    cfg = SchedulerConfig(max_model_len=256, block_size=4, num_kv_blocks=256)
    runner = ARModelRunner(build_ar_model(bundle), cfg, torch.device("cpu"), torch.float32)
    engine = StageEngine("talker", ARScheduler(cfg, window_k=8), runner)
    engine.add_request(
        TalkerProcessor(bundle.tokenizer, bundle.vocab, 256).make_request(
            speech("a", max_new_tokens=50)
        )
    )
    outputs = engine.run_until_idle()
    tokens = [t for o in outputs for t in o.tokens]
    assert len(tokens) == 3 and tokens[-1] == 2150
    assert outputs[-1].finish_reason == "stop"
    engine.step()
    assert engine.scheduler.kv.num_used_blocks == 0 and not runner.requests


def test_fused_pipeline_audio_is_identical_with_windows():
    plain = build("qwen3_tts_fused")
    windowed = build("qwen3_tts_fused", "pipeline.stages.talker.window_k=6")
    try:
        req = speech("w", max_new_tokens=25, ignore_eos=True, seed=8)
        a, b = Collector(), Collector()
        plain.submit(req, a)
        windowed.submit(req, b)
        pa, pb = a.wait().pcm, b.wait().pcm
        assert pa.shape == pb.shape == (25 * 1920,)
        assert np.array_equal(pa, pb)
        assert stage_stats(windowed, "talker").windows.executed > 0
    finally:
        plain.stop()
        windowed.stop()


def test_stats_mention_windows_only_when_enabled():
    _, _, plain = generate([fixed("a", 4)])
    _, _, win = generate([fixed("a", 4)], window_k=4)
    assert not any("window" in k for k in plain.scheduler.stats())
    assert "planned_windows" in win.scheduler.stats()
