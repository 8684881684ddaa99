"""The stalls the server can see (`omniflow_stalls_total`, `omniflow_stall_seconds_total`):
a streamed response plays its audio on a zero-buffer player (`core/player.py`) as it sends
it; audio sent after the player ran dry is a stall. Whole responses have no playback."""

from __future__ import annotations

import threading

import httpx
import numpy as np

from omniflow.config.compose import compose
from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import UNBOUNDED
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline

BODY = {"model": "qwen3-tts-tiny", "voice": "vivian", "input": "hi", "response_format": "pcm"}


class GatedPipeline(FakePipeline):
    """Sends `first_samples` of audio at once, then the rest and the end only when the test
    opens the gate (after it has read the first audio)."""

    def __init__(self, first_samples: int) -> None:
        super().__init__()
        self.first_samples = first_samples
        self.gate = threading.Event()

    def submit(self, speech, sink, limits=UNBOUNDED) -> None:
        rid = speech.request_id
        sink(AudioEvent(rid, pcm=np.zeros(self.first_samples, np.float32), frames=1))

        def rest() -> None:
            assert self.gate.wait(30)
            sink(AudioEvent(rid, pcm=np.zeros(1920, np.float32), frames=2))
            sink(AudioEvent(rid, finished=True, finish_reason="length", frames=2))

        threading.Thread(target=rest, daemon=True).start()


def counters(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics").text
    value = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln[:1] != "#"}
    return value["omniflow_stalls_total"], value["omniflow_stall_seconds_total"]


def stream_one(first_samples: int, stream: bool = True) -> tuple[float, float]:
    """Stalls and stall seconds one request added; the second audio goes out only after the
    client has the first."""
    pipe = GatedPipeline(first_samples)
    with ServerThread(pipe, compose(["platform=cpu"]).server) as server:
        before = counters(server.url)
        body = {**BODY, "stream": stream}
        with httpx.stream("POST", server.url + "/v1/audio/speech", json=body) as r:
            chunks = r.iter_raw()
            if stream:
                assert next(chunks)  # the first audio is here
            pipe.gate.set()
            for _ in chunks:
                pass
        after = counters(server.url)
    return after[0] - before[0], after[1] - before[1]


def test_audio_sent_after_the_player_ran_dry_is_a_stall():
    # one sample (42 us of audio) cannot cover the round trip to the client and back
    stalls, seconds = stream_one(first_samples=1)
    assert stalls == 1 and seconds > 0


def test_enough_audio_ahead_is_no_stall():
    stalls, seconds = stream_one(first_samples=24000 * 30)  # 30 s ahead
    assert (stalls, seconds) == (0, 0)


def test_a_whole_response_counts_no_stall():
    pipe = GatedPipeline(1)
    pipe.gate.set()
    with ServerThread(pipe, compose(["platform=cpu"]).server) as server:
        before = counters(server.url)
        r = httpx.post(server.url + "/v1/audio/speech", json=BODY)
        assert r.status_code == 200
        assert counters(server.url) == before
