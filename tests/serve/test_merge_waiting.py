"""`event_queue.merge_waiting`: a request's events already waiting behind the one just taken
are sent as one (their PCM in order, the last one's progress and ending), so a response whose
event loop fell behind does its per-send work once; with nothing waiting, nothing changes."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np

from omniflow.config.compose import compose
from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import UNBOUNDED
from omniflow.serve.event_queue import merge_waiting
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline


def queue_of(*events: AudioEvent) -> asyncio.Queue[AudioEvent]:
    q: asyncio.Queue[AudioEvent] = asyncio.Queue()
    for ev in events:
        q.put_nowait(ev)
    return q


def pcm(start: int, n: int = 4) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.float32)


def ramp(start: int, n: int = 4) -> np.ndarray:
    """Samples start/100 .. (start+n-1)/100: inside [-1, 1], so their order survives PCM16."""
    return np.arange(start, start + n, dtype=np.float32) / 100


def test_nothing_waiting_returns_the_event_itself():
    ev = AudioEvent("r", pcm=pcm(0), frames=1)
    assert merge_waiting(ev, queue_of()) is ev


def test_waiting_audio_and_the_end_become_one_event():
    first = AudioEvent("r", pcm=pcm(0), frames=1, seated_at=1.0)
    q = queue_of(
        AudioEvent("r", pcm=pcm(4), frames=2),
        AudioEvent("r", pcm=pcm(8), frames=3),
        AudioEvent("r", finished=True, finish_reason="length", frames=3, seated_at=2.0),
    )
    got = merge_waiting(first, q)
    assert np.array_equal(got.pcm, np.arange(12, dtype=np.float32))
    assert (got.frames, got.finished, got.finish_reason, got.error) == (3, True, "length", None)
    assert got.made_at == first.made_at  # made when its first part was (first-audio split)
    assert (got.request_id, got.seated_at) == ("r", 1.0)  # seated when its first part says
    assert q.empty()


def test_merging_stops_at_the_end_and_keeps_an_error():
    first = AudioEvent("r", pcm=pcm(0), frames=1)
    late = AudioEvent("r", pcm=pcm(99), frames=9)
    q = queue_of(
        AudioEvent("r", pcm=pcm(4), frames=2),
        AudioEvent("r", finished=True, finish_reason="error", error="boom"),
        late,
    )
    got = merge_waiting(first, q)
    assert np.array_equal(got.pcm, np.arange(8, dtype=np.float32))
    assert got.finished and got.error == "boom" and got.finish_reason == "error"
    assert q.get_nowait() is late  # nothing past the end is taken


def test_the_merged_event_keeps_the_furthest_progress():
    """An ending event that carries no frame count does not erase the progress before it."""
    first = AudioEvent("r", pcm=pcm(0), frames=1)
    q = queue_of(AudioEvent("r", pcm=pcm(4), frames=2), AudioEvent("r", finished=True))
    assert merge_waiting(first, q).frames == 2


def test_an_ending_event_is_not_merged_with_anything():
    end = AudioEvent("r", finished=True, finish_reason="length")
    q = queue_of(AudioEvent("r", pcm=pcm(0)))
    assert merge_waiting(end, q) is end and q.qsize() == 1


class InstantPipeline(FakePipeline):
    """Hands a request's whole audio to its sink at submit, one event per frame, so that all
    of it is waiting when the response starts; counts the response's `consumed` calls (one
    per event it sent on)."""

    def __init__(self) -> None:
        super().__init__()
        self.consumed_calls: list[int] = []

    def submit(self, speech, sink, limits=UNBOUNDED) -> None:
        frames = speech.max_new_tokens or 1
        for i in range(frames):
            sink(AudioEvent(speech.request_id, pcm=ramp(4 * i), frames=i + 1))
        sink(AudioEvent(speech.request_id, finished=True, finish_reason="length", frames=frames))

    def consumed(self, request_id: str, samples: int) -> None:
        self.consumed_calls.append(samples)


def test_a_response_sends_waiting_events_as_one_chunk():
    """Six frames all waiting: the response takes the first, then the other five as one event
    (two sends, not six); the client gets every sample in order."""
    pipe = InstantPipeline()
    with ServerThread(pipe, compose(["platform=cpu"]).server) as server:
        body = {
            "model": "qwen3-tts-tiny",
            "voice": "vivian",
            "input": "hi",
            "response_format": "pcm",
            "stream": True,
            "max_new_tokens": 6,
        }
        r = httpx.post(server.url + "/v1/audio/speech", json=body)
    assert r.status_code == 200
    got = np.frombuffer(r.content, dtype=np.int16)
    want = np.round(np.arange(24, dtype=np.float32) / 100 * 32767).astype(np.int16)
    assert np.array_equal(got, want)
    assert pipe.consumed_calls == [4, 20]


def test_a_merged_ending_keeps_when_a_live_texts_end_was_taken():
    """The WebSocket's text tail (`omniflow_ws_text_tail_*`) reads the ending's
    `text_done_at` and `text_done_frames`: merging must not drop them."""
    first = AudioEvent("r", pcm=pcm(0), frames=1)
    end = AudioEvent("r", frames=9, finished=True, text_done_at=12.5, text_done_frames=4)
    merged = merge_waiting(first, queue_of(AudioEvent("r", pcm=pcm(4), frames=2), end))
    assert merged.finished and merged.text_done_at == 12.5 and merged.text_done_frames == 4
