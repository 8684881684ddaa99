"""`benchmarks.in_process_lanes`: the load generator's closed-loop round sent to the pipeline
in-process, lanes kept full and each request's audio read as the served client reads it."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from benchmarks.in_process_lanes import SAMPLES_PER_FRAME, Lane, Target, one_round
from omniflow.bench.client import Prompt, load_prompts
from omniflow.bench.outcome import Failure, Sample, summarize
from omniflow.bench.prompt_file import DEFAULT_PROMPTS
from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import Overloaded, RequestLimits
from omniflow.core.speech import SpeechRequest

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
        target = Target(orch, RequestLimits(10.0, None), "vivian", SR)
        outcome = one_round(target, prompts, concurrency=3, label="r1")
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


class Recorder:
    """A pipeline that ends every request at once (its frames of audio, or an error), refuses
    one, and records what it was sent and told."""

    def __init__(self, refuse_seed: int, fail_seed: int) -> None:
        self.refuse_seed, self.fail_seed = refuse_seed, fail_seed
        self.sent: list[tuple[SpeechRequest, RequestLimits]] = []
        self.took: list[tuple[str, int]] = []

    def submit(self, speech: SpeechRequest, sink, limits: RequestLimits) -> None:
        self.sent.append((speech, limits))
        rid = speech.request_id
        if speech.seed == self.refuse_seed:
            raise Overloaded("the server is at capacity", 0.5)
        if speech.seed == self.fail_seed:
            sink(AudioEvent(rid, finished=True, finish_reason="error", error="boom"))
            return
        sink(AudioEvent(rid, pcm=frames(speech.max_new_tokens)))
        sink(AudioEvent(rid, finished=True, finish_reason="length"))

    def consumed(self, request_id: str, samples: int) -> None:
        self.took.append((request_id, samples))


def test_a_round_sends_the_load_generators_requests_in_order_under_the_servers_limits():
    prompts = [Prompt(f"line {i}", 2 + i % 3) for i in range(6)]
    fake = Recorder(refuse_seed=1002, fail_seed=1003)
    limits = RequestLimits(10.0, 0.3)
    outcome = one_round(Target(fake, limits, "ryan", SR), prompts, concurrency=2, label="r2")
    sent = [speech for speech, _ in fake.sent]
    assert [s.text for s in sent] == [p.text for p in prompts]  # each once, in order
    assert [s.seed for s in sent] == [1000 + i for i in range(6)]
    assert [s.request_id for s in sent] == [f"r2-{i}" for i in range(6)]
    assert all(s.voice == "ryan" and s.ignore_eos for s in sent)
    assert [s.max_new_tokens for s in sent] == [p.frames for p in prompts]
    assert all(got is limits for _, got in fake.sent)
    # the refused and the failed request are failures; their lanes went on to the next
    assert sorted(f.prompt for f in outcome.failures) == [2, 3]
    assert "at capacity" in str([f.error for f in outcome.failures if f.prompt == 2])
    assert len(outcome.samples) == 4
    # every PCM event's samples were handed back, as the server does once it sent them
    ok = [i for i in range(6) if i not in (2, 3)]
    assert fake.took == [(f"r2-{i}", prompts[i].frames * SAMPLES_PER_FRAME) for i in ok]
