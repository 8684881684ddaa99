"""`benchmarks.in_process_lanes`: the load generator's closed-loop round sent to the pipeline
in-process, lanes kept full and each request's audio read as the served client reads it."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from benchmarks.in_process_lanes import SAMPLES_PER_FRAME, Lane, one_round
from omniflow.bench.client import Prompt, load_prompts
from omniflow.bench.outcome import Failure, Sample, summarize
from omniflow.bench.prompt_file import DEFAULT_PROMPTS
from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.events import AudioEvent

SR = 24000


def frames(n: int) -> np.ndarray:
    return np.zeros(n * SAMPLES_PER_FRAME, dtype=np.float32)


def test_a_lane_reads_its_audio_as_a_zero_buffer_player():
    lane = Lane(0, Prompt("hi", 3), sent=100.0, done=queue.SimpleQueue(), sample_rate=SR)
    lane.take(AudioEvent("r", pcm=frames(1)), 0.100)  # 0.08 s of audio from 0.100
    lane.take(AudioEvent("r", pcm=frames(1)), 0.300)  # wanted 0.200 s by then, had 0.080
    lane.take(AudioEvent("r", pcm=frames(1), finished=True), 0.310)
    sample = lane.result(t0=99.0)
    assert isinstance(sample, Sample)
    assert sample.ttfp == pytest.approx(0.100)
    assert sample.e2el == pytest.approx(0.310)
    assert sample.underrun_s == pytest.approx(0.120)
    assert sample.audio_s == pytest.approx(3 * 0.08)
    assert sample.sent_s == pytest.approx(1.0)
    assert lane.done.get_nowait() is lane


def test_short_audio_or_an_error_is_a_failure():
    short = Lane(4, Prompt("hi", 3), sent=0.0, done=queue.SimpleQueue(), sample_rate=SR)
    short.take(AudioEvent("r", pcm=frames(2), finished=True), 0.2)
    failed = short.result(t0=0.0)
    assert isinstance(failed, Failure) and failed.prompt == 4
    assert (
        failed.error
        == f"short audio: got {2 * SAMPLES_PER_FRAME} of {3 * SAMPLES_PER_FRAME} samples"
    )
    broken = Lane(5, Prompt("hi", 3), sent=0.0, done=queue.SimpleQueue(), sample_rate=SR)
    broken.take(AudioEvent("r", finished=True, finish_reason="error", error="boom"), 0.1)
    assert broken.result(t0=0.0) == Failure(5, "boom", 0.1, sent_s=0.0)


def test_a_round_keeps_every_lane_busy_and_no_more():
    orch = build_pipeline(build_graph(compose(["platform=cpu"])))
    prompts = load_prompts(DEFAULT_PROMPTS, 7, max_frames=3)
    orch.start()
    try:
        outcome = one_round(orch, prompts, concurrency=3, voice="vivian")
    finally:
        orch.stop()
    assert not outcome.failures and len(outcome.samples) == 7
    assert all(s.audio_s == pytest.approx(3 * 0.08) for s in outcome.samples)
    # in flight at each send: never more than the lanes, and the lanes were filled
    spans = [(s.sent_s, s.sent_s + s.e2el) for s in outcome.samples]
    in_flight = [sum(a <= t < b for a, b in spans) for t, _ in spans]
    assert max(in_flight) == 3
    summary = summarize(outcome)
    assert summary["completed"] == 7 and summary["steady"] is not None
