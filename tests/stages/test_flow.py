"""Backpressure through the orchestrator (docs/reliability.md): a consumer that stops taking
audio pauses its request at the configured amount, keeping its state; the backlog between
stages pauses the upstream; reading again resumes it and the audio is exactly what an
unpaused run gives."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from omniflow.core.pipeline import RequestLimits
from omniflow.engine.flow import Bound, FlowTotals, RequestFlow, edge_bound
from omniflow.engine.messages import Pause, Resume
from tests.factories import Collector, build, speech, stage_stats, tiny_bundle, wait_idle

SPF = 1920
SR = 24000


class Reader(Collector):
    """A consumer that takes nothing until `read()`, then acknowledges every sample (the
    HTTP response's part: `consumed` once the audio has been sent on)."""

    def __init__(self, orch, rid: str) -> None:
        super().__init__()
        self.orch, self.rid = orch, rid
        self.lock = threading.Lock()
        self.reading = False
        self.unread = 0

    def __call__(self, event) -> None:
        with self.lock:
            super().__call__(event)
            if event.pcm is not None:
                self.unread += event.pcm.size
            if self.reading:
                self._take()

    def read(self) -> None:
        with self.lock:
            self.reading = True
            self._take()

    def _take(self) -> None:
        taken, self.unread = self.unread, 0
        if taken:
            self.orch.consumed(self.rid, taken)


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


SMALL_CHUNKS = "pipeline.stages.code2wav.upstream.chunk_frames=5"


def reference(pipeline: str, request, *overrides: str) -> np.ndarray:
    orch = build(pipeline, *overrides, bundle=tiny_bundle())
    try:
        c = Collector()
        orch.submit(request, c)
        return c.wait().pcm
    finally:
        orch.stop()


def test_fused_request_pauses_at_its_buffer_keeps_its_state_and_resumes_exactly():
    frames = 30
    ref = reference("qwen3_tts_fused", speech("ref", max_new_tokens=frames, ignore_eos=True))
    orch = build("qwen3_tts_fused", bundle=tiny_bundle())
    try:
        reader = Reader(orch, "a")
        orch.submit(
            speech("a", max_new_tokens=frames, ignore_eos=True),
            reader,
            RequestLimits(max_buffered_s=0.5),
        )
        wait_for(lambda: stage_stats(orch, "talker").paused == 1)
        stats = orch.stats()
        talker = stats.stages[0]
        # paused at 0.5 s (7 frames of 0.08 s), with at most a step of slack
        assert 0.5 <= stats.buffered_audio_s <= 0.5 + 2 * SPF / SR
        assert talker.kv_blocks_used and talker.decoder_slots_used == 1 and talker.running == 1
        assert stats.in_flight == 1 and not reader.done.is_set()
        assert reader.pcm.size == round(stats.buffered_audio_s * SR)  # nothing more was made
        reader.read()
        reader.wait()
        assert reader.terminal.finish_reason == "length"
        assert reader.pcm.shape == ref.shape == (frames * SPF,)
        assert np.array_equal(reader.pcm, ref)
        wait_idle(orch)
        assert orch.stats().buffered_audio_s == 0 and stage_stats(orch, "talker").paused == 0
    finally:
        orch.stop()


def test_two_stage_client_pause_cascades_to_the_talker_through_the_bounded_backlog():
    frames = 40
    ref = reference(
        "qwen3_tts", speech("ref", max_new_tokens=frames, ignore_eos=True), SMALL_CHUNKS
    )
    orch = build("qwen3_tts", SMALL_CHUNKS, bundle=tiny_bundle())
    try:
        reader = Reader(orch, "a")
        orch.submit(
            speech("a", max_new_tokens=frames, ignore_eos=True),
            reader,
            RequestLimits(max_buffered_s=0.5),
        )
        wait_for(lambda: all(s.paused == 1 for s in orch.stats().stages))
        talker, code2wav = orch.stats().stages
        # code2wav paused after its chunks of 1, 5 and 5 frames (0.88 s >= 0.5 s); the talker
        # at a backlog of two 5-frame chunks (the floor above 0.5 s = 7 frames)
        assert reader.pcm.size == 11 * SPF
        assert 10 <= code2wav.backlog_frames <= 11 and talker.backlog_frames is None
        assert talker.kv_blocks_used and code2wav.decoder_slots_used == 1
        reader.read()
        reader.wait()
        assert reader.pcm.shape == ref.shape == (frames * SPF,)
        assert np.array_equal(reader.pcm, ref)
        wait_idle(orch)
        assert stage_stats(orch, "code2wav").backlog_frames == 0
    finally:
        orch.stop()


def test_a_request_without_flow_control_never_pauses():
    orch = build("qwen3_tts_fused", bundle=tiny_bundle())
    try:
        c = Collector()
        orch.submit(speech("a", max_new_tokens=20, ignore_eos=True), c)  # nobody acknowledges
        assert c.wait().pcm.size == 20 * SPF
        assert orch.stats().buffered_audio_s == 0
    finally:
        orch.stop()


def test_abort_with_an_error_ends_a_paused_request_once_and_releases_it():
    orch = build("qwen3_tts", SMALL_CHUNKS, bundle=tiny_bundle())
    try:
        reader = Reader(orch, "a")
        orch.submit(
            speech("a", max_new_tokens=200, ignore_eos=True),
            reader,
            RequestLimits(max_buffered_s=0.1),
        )
        wait_for(lambda: stage_stats(orch, "code2wav").paused == 1)
        orch.abort("a", error="the server is shutting down")
        end = reader.wait().terminal
        assert end.finish_reason == "error" and end.error == "the server is shutting down"
        wait_idle(orch)
        stats = orch.stats()
        assert stats.buffered_audio_s == 0 and all(s.paused == 0 for s in stats.stages)
        assert stage_stats(orch, "code2wav").backlog_frames == 0
    finally:
        orch.stop()


def flow(totals: FlowTotals | None = None) -> RequestFlow:
    return RequestFlow(
        "r", "dec", Bound.at(100), {"dec": ("src", Bound.at(10))}, totals or FlowTotals()
    )


def test_flow_pauses_at_the_high_mark_and_resumes_at_half():
    f = flow()
    assert f.on_audio(99) == []
    assert f.on_audio(1) == [("dec", Pause("r"))]
    assert f.on_audio(50) == []  # already paused: one message
    assert f.on_consumed(99) == []  # 51 left
    assert f.on_consumed(1) == [("dec", Resume("r"))]
    assert f.on_sent("dec", 10) == [("src", Pause("r"))]
    assert f.on_used("dec", 4) == []
    assert f.on_used("dec", 1) == [("src", Resume("r"))]
    assert f.on_sent("other", 1000) == []  # not an edge of this pipeline


def test_totals_follow_every_request_and_forget_an_ended_one():
    totals = FlowTotals()
    a, b = flow(totals), flow(totals)
    a.on_audio(30)
    b.on_audio(20)
    b.on_consumed(5)
    a.on_sent("dec", 7)
    assert totals.buffered == 45 and totals.backlog == {"dec": 7}
    a.release()
    assert totals.buffered == 15 and totals.backlog == {"dec": 0}
    b.on_consumed(1000)  # more than was delivered: clipped, never negative
    assert totals.buffered == 0


@pytest.mark.parametrize(
    ("frames", "first", "chunk", "high"), [(125, 1, 25, 125), (7, 1, 25, 50), (7, 40, 25, 80)]
)
def test_an_edge_holds_at_least_two_of_its_largest_chunks(frames, first, chunk, high):
    bound = edge_bound(frames, first, chunk)
    assert bound.high == high and bound.low == high // 2 >= max(first, chunk)
