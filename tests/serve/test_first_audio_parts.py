"""First-audio latency and its three parts in /metrics: intake (arrival -> submitted), made
(submitted -> the pipeline's first audio event; a whole response: its last), delivery (->
first bytes sent). They add up to `omniflow_first_audio_seconds`; a stream records them at
its first body bytes, and the end-to-end latency at its last. Made and delivery split in two
each (at the seat; where the request's handler took the audio)."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from omniflow.config.compose import compose
from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import UNBOUNDED
from omniflow.serve.bodies import raw_stream
from omniflow.serve.run import ServerThread
from omniflow.serve.sending import PacedStream
from tests.serve.conftest import LiveServer
from tests.serve.fake_pipeline import FakePipeline

MODEL = "qwen3-tts-tiny"
PARTS = ("intake", "made", "delivery")


@pytest.fixture(scope="module")
def server():
    with LiveServer() as live:
        yield live


def sample(live, name: str, suffix: str) -> float:
    registry = live.app.state.service.metrics.registry
    value = registry.get_sample_value(f"omniflow_{name}_seconds_{suffix}")
    assert value is not None, name
    return value


def counts(live) -> list[float]:
    names = ["first_audio", *(f"first_audio_{p}" for p in PARTS), "e2e"]
    return [sample(live, n, "count") for n in names]


def settled(live, before: list[float]) -> list[float]:
    """The counts once the last request's response hooks have run: the client can read the
    response's end before the server's send of it returns (a bounded poll, as `wait_idle`)."""
    deadline = time.monotonic() + 10
    while counts(live)[-1] == before[-1] and time.monotonic() < deadline:
        time.sleep(0.001)
    return counts(live)


def body(frames: int, **extra) -> dict:
    return {
        "model": MODEL,
        "voice": "vivian",
        "input": "First audio, in parts.",
        "seed": 1,
        "max_new_tokens": frames,
        "ignore_eos": True,
        **extra,
    }


KINDS = [
    {"response_format": "pcm", "stream": True},
    {"response_format": "wav", "stream": True},
    {"response_format": "mp3", "stream": True},
    {"response_format": "pcm", "stream_format": "sse"},
    {"response_format": "wav"},  # whole
]


def test_the_parts_add_up_to_the_first_audio_once_per_request_of_every_kind(server):
    before = counts(server)
    for extra in KINDS:
        first, e2e = sample(server, "first_audio", "sum"), sample(server, "e2e", "sum")
        now = counts(server)
        r = httpx.post(server.url + "/v1/audio/speech", json=body(3, **extra), timeout=60)
        assert r.status_code == 200
        assert settled(server, now) == [n + 1 for n in now], extra
        # its last bytes went out no earlier than its first
        e2e_delta = sample(server, "e2e", "sum") - e2e
        assert e2e_delta >= sample(server, "first_audio", "sum") - first, extra
    assert counts(server) == [n + len(KINDS) for n in before]
    parts = [sample(server, f"first_audio_{p}", "sum") for p in PARTS]
    assert all(p > 0 for p in parts), parts
    # one clock (time.perf_counter) on both threads: the split points are shared
    total = sample(server, "first_audio", "sum")
    assert sum(parts) == pytest.approx(total, rel=1e-9, abs=1e-9)


class SlowHandOff(FakePipeline):
    """Each event reaches the server HANDOFF_S after the pipeline made it (a busy engine
    thread between making an event and handing it over)."""

    def submit(self, speech, sink, limits=UNBOUNDED) -> None:
        def late(ev: AudioEvent) -> None:
            time.sleep(HANDOFF_S)  # the latency under test, not a synchronisation
            sink(ev)

        super().submit(speech, late, limits)


HANDOFF_S = 0.05


@pytest.mark.parametrize("stream", [True, False])
def test_the_made_point_is_when_the_pipeline_made_the_event_not_when_the_server_got_it(stream):
    """Streamed: delivery holds the first event's hand-off; whole: the body is made when its
    last event is, so delivery holds that one's hand-off, and `made` the earlier ones."""
    pipeline = SlowHandOff()
    with ServerThread(pipeline, compose(["platform=cpu"]).server) as live:
        r = httpx.post(
            live.url + "/v1/audio/speech",
            json=body(3, response_format="pcm", stream=stream),
            timeout=60,
        )
        assert r.status_code == 200
        assert sample(live, "first_audio_delivery", "count") == 1
        assert sample(live, "first_audio_delivery", "sum") >= HANDOFF_S
        made = sample(live, "first_audio_made", "sum")
        assert made >= (3 * HANDOFF_S if not stream else 0)  # 3 frames' events before the end


def test_a_stream_calls_its_first_and_last_body_hooks_after_those_sends_complete():
    """`PacedStream` calls `on_first_body` once the first body message has been sent (not
    at the response's start, not per chunk) and `on_last_body` once the body's end has."""
    calls: list[str] = []
    release = asyncio.Event()

    async def chunks():
        yield b"one"
        yield b"two"

    async def send(message) -> None:
        calls.append(f"send {message['type']} {message.get('body', b'')!r}")
        if message.get("body") == b"one":
            await release.wait()  # the client has not taken the first bytes yet

    async def scenario() -> None:
        stream = PacedStream(
            chunks(),
            "audio/pcm",
            30.0,
            lambda: calls.append("end"),
            on_first_body=lambda: calls.append("FIRST"),
            on_last_body=lambda: calls.append("LAST"),
        )
        task = asyncio.create_task(stream.stream_response(send))
        for _ in range(1000):  # let the response run up to its first body send
            if calls and calls[-1].endswith("b'one'"):
                break
            await asyncio.sleep(0)
        assert "FIRST" not in calls  # that send has not completed
        release.set()
        await task

    asyncio.run(scenario())
    assert calls == [
        "send http.response.start b''",
        "send http.response.body b'one'",
        "FIRST",
        "send http.response.body b'two'",
        "send http.response.body b''",
        "LAST",
    ]


def test_a_streamed_wav_sends_its_header_with_the_first_audio():
    async def events():
        yield AudioEvent("r", pcm=np.zeros(1920, dtype=np.float32), frames=1)
        yield AudioEvent("r", pcm=np.zeros(1920, dtype=np.float32), frames=2)

    async def collect() -> list[bytes]:
        return [c async for c in raw_stream(events(), "wav", 24000)]

    chunks = asyncio.run(collect())
    assert [len(c) for c in chunks] == [44 + 3840, 3840]
    assert chunks[0][:4] == b"RIFF"


SPLITS = {
    "made": ("first_audio_made", "first_audio_queued", "first_audio_steps"),
    "delivery": ("first_audio_delivery", "first_audio_handoff", "first_audio_response"),
}


@pytest.mark.parametrize("split", SPLITS)
def test_a_part_splits_in_two_that_add_up_to_it(server, split):
    """`made` = `queued` + `steps` (the tiny talker says when it seated each request);
    `delivery` = `handoff` (to the request's handler on the event loop) + `response` (to
    the first bytes sent). Each half counted once per request, streamed and whole."""
    names = SPLITS[split]
    now = counts(server)
    for extra in ({"response_format": "pcm", "stream": True}, {"response_format": "wav"}):
        before = {n: (sample(server, n, "count"), sample(server, n, "sum")) for n in names}
        r = httpx.post(server.url + "/v1/audio/speech", json=body(3, **extra), timeout=60)
        assert r.status_code == 200
        now = settled(server, now)
        delta = {
            n: (sample(server, n, "count") - c, sample(server, n, "sum") - s)
            for n, (c, s) in before.items()
        }
        assert [c for c, _ in delta.values()] == [1, 1, 1], extra
        whole, first, second = (s for _, s in delta.values())
        assert first > 0 and second > 0, extra
        assert first + second == pytest.approx(whole, rel=1e-9, abs=1e-9)
