"""First-audio latency and its three parts in /metrics: intake (arrival -> submitted), made
(submitted -> the pipeline's first audio event), delivery (-> first bytes sent). They add up
to `omniflow_first_audio_seconds`, and a stream records them at its first bytes, not its end."""

from __future__ import annotations

import time

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.serve.run import ServerThread
from omniflow.stages.orchestrator import AudioEvent
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
    value = registry.get_sample_value(f"omniflow_first_audio{name}_seconds_{suffix}")
    assert value is not None, name
    return value


def counts(live) -> list[float]:
    return [sample(live, "", "count")] + [sample(live, f"_{p}", "count") for p in PARTS]


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


def test_the_parts_add_up_to_the_first_audio_for_streamed_and_whole_responses(server):
    before = counts(server)
    for extra in ({"response_format": "pcm", "stream": True}, {"response_format": "wav"}):
        r = httpx.post(server.url + "/v1/audio/speech", json=body(3, **extra), timeout=60)
        assert r.status_code == 200
    assert counts(server) == [n + 2 for n in before]
    parts = [sample(server, f"_{p}", "sum") for p in PARTS]
    assert all(p > 0 for p in parts), parts
    # one clock (time.perf_counter) on both threads: the split points are shared
    assert sum(parts) == pytest.approx(sample(server, "", "sum"), rel=1e-9, abs=1e-9)


def test_a_stream_records_its_first_audio_when_its_first_bytes_go_out(server):
    """Observed at the first bytes sent, while the request is still generating: a stream
    that recorded it at its end (or at the response's creation, before any byte) would not
    show a count here that moves exactly when the first chunk has arrived."""
    before = counts(server)
    frames = 200  # the tiny CPU model takes several seconds for these
    with httpx.stream(
        "POST",
        server.url + "/v1/audio/speech",
        json=body(frames, response_format="pcm", stream=True),
        timeout=60,
    ) as r:
        assert r.status_code == 200
        chunks = r.iter_raw()
        assert next(chunks)  # the first audio arrived
        deadline = time.monotonic() + 10
        while counts(server)[0] == before[0] and time.monotonic() < deadline:
            time.sleep(0.005)  # the server thread records it right after its send returns
        assert counts(server) == [n + 1 for n in before]
        assert server.pipeline.stats().in_flight == 1  # still generating
        assert next(chunks)  # more audio: recorded once per request, not per chunk
    server.wait_idle()  # leaving early aborts the request
    assert counts(server) == [n + 1 for n in before]


class SlowHandOff(FakePipeline):
    """Each event reaches the server HANDOFF_S after the pipeline made it (a busy engine
    thread between making an event and handing it over)."""

    def submit(self, speech, sink, max_buffered_s=None) -> None:
        def late(ev: AudioEvent) -> None:
            time.sleep(HANDOFF_S)  # the latency under test, not a synchronisation
            sink(ev)

        super().submit(speech, late, max_buffered_s)


HANDOFF_S = 0.05


def test_the_made_point_is_when_the_pipeline_made_the_event_not_when_the_server_got_it():
    pipeline = SlowHandOff()
    with ServerThread(pipeline, compose(["platform=cpu"]).server) as live:
        r = httpx.post(
            live.url + "/v1/audio/speech",
            json=body(2, response_format="pcm", stream=True),
            timeout=60,
        )
        assert r.status_code == 200
        assert sample(live, "_delivery", "count") == 1
        assert sample(live, "_delivery", "sum") >= HANDOFF_S  # its first hand-off is delivery
