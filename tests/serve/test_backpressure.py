"""Slow and stalled clients over real sockets (docs/reliability.md).

A client that stops reading fills the socket buffers, then uvicorn holds the response's next
send; the audio then waits in the response, and at `server.max_buffered_audio_s` the request
is paused, keeping its KV blocks and decoder slot, until the client reads again. A client that
takes nothing for `server.stalled_client_timeout_s` is dropped and its request aborted.

Both ends use small socket buffers, so the kernel holds a few kilobytes, not megabytes, and
the pause comes after about two seconds of audio instead of a minute.
"""

from __future__ import annotations

import http.client
import json
import socket
import time

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.errors import ConfigError
from tests.serve.conftest import LiveServer, assert_released

SPF = 1920
SR = 24000
SMALL = 4096
BODY = {
    "model": "qwen3-tts-tiny",
    "voice": "vivian",
    "input": "A client that stops reading.",
    "response_format": "pcm",
    "stream": True,
    "seed": 4,
    "ignore_eos": True,
}


def small_buffer_server(*overrides: str) -> LiveServer:
    server = LiveServer(*overrides)
    server.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL)  # accepted ones inherit
    return server


def slow_client(server: LiveServer, frames: int) -> http.client.HTTPResponse:
    """A streamed request whose response headers have arrived; its body is left unread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL)  # before connect: the window
    sock.connect(("127.0.0.1", server.port))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.sock = sock
    body = json.dumps({**BODY, "max_new_tokens": frames})
    conn.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    return response


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def metric(text: str, name: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
    return float(line.split()[-1])


def test_a_client_that_stops_reading_pauses_its_request_until_it_reads_again():
    frames = 80
    with small_buffer_server("server.max_buffered_audio_s=0.5") as server:
        response = slow_client(server, frames)
        wait_for(lambda: server.pipeline.stats().stages[0].paused == 1)
        stats = server.pipeline.stats()
        talker = stats.stages[0]
        # paused with 0.5 s waiting in the response, plus at most a step's frame or two
        assert 0.5 <= stats.buffered_audio_s <= 0.5 + 2 * SPF / SR
        assert talker.kv_blocks_used and talker.decoder_slots_used == 1
        assert stats.in_flight == 1
        text = httpx.get(server.url + "/metrics").text
        assert metric(text, 'omniflow_requests_paused{stage="talker"}') == 1
        assert metric(text, "omniflow_buffered_audio_seconds") >= 0.5
        assert metric(text, 'omniflow_decoder_slots_in_use{stage="talker"}') == 1
        assert metric(text, 'omniflow_requests_running{stage="talker"}') == 1
        assert metric(text, 'omniflow_requests_waiting{stage="talker"}') == 0
        assert metric(text, "process_resident_memory_bytes") > 0
        assert len(response.read()) == frames * SPF * 2  # reading resumes it: every byte
        server.wait_idle()
        assert_released(server.pipeline.stats())
        text = httpx.get(server.url + "/metrics").text
        assert metric(text, 'omniflow_requests_total{outcome="ok"}') == 1
        assert metric(text, "omniflow_buffered_audio_seconds") == 0


def test_a_client_that_takes_nothing_past_the_timeout_is_dropped_and_its_request_freed(caplog):
    """With one WARNING naming why, and not uvicorn's ERROR for an incomplete response."""
    overrides = ("server.max_buffered_audio_s=0.5", "server.stalled_client_timeout_s=0.5")
    caplog.set_level("WARNING")
    with small_buffer_server(*overrides) as server:
        response = slow_client(server, 2000)
        server.wait_idle()  # aborted by the server, not by the client
        assert_released(server.pipeline.stats())
        text = httpx.get(server.url + "/metrics").text
        assert metric(text, 'omniflow_requests_total{outcome="abort"}') == 1
        with pytest.raises(http.client.IncompleteRead):
            response.read()  # the server closed the connection mid-body (after logging)
        assert "client read nothing for 0.5 s: request aborted" in caplog.text
        assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
        ok = httpx.post(server.url + "/v1/audio/speech", json={**BODY, "max_new_tokens": 3})
        assert ok.status_code == 200 and len(ok.content) == 3 * SPF * 2


@pytest.mark.parametrize(
    "override",
    [
        "server.max_buffered_audio_s=0",
        "server.max_buffered_audio_s=inf",
        "server.stalled_client_timeout_s=-1",
        "server.stalled_client_timeout_s=nan",
    ],
)
def test_backpressure_settings_are_validated_with_their_key_path(override):
    with pytest.raises(ConfigError) as exc:
        compose([override])
    assert override.split("=")[0] in str(exc.value)


def test_the_incomplete_response_error_is_kept_for_any_other_end():
    """Only a stream `PacedStream` ended on purpose (in that request's task) drops it."""
    import logging

    from omniflow.serve.uvicorn_logs import UVICORN_INCOMPLETE, UvicornNoise

    record = logging.LogRecord(
        "uvicorn.error", logging.ERROR, "", 0, UVICORN_INCOMPLETE, None, None
    )
    assert UvicornNoise().filter(record)
