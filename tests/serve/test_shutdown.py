"""Shutdown under load (docs/reliability.md): SIGTERM with requests in flight ends each of
them with an error its client can see, logs no ASGI traceback, and exits 0.

The first test runs `python -m omniflow serve` (the embedded default on a free loopback
port) as a child process, with a streamed SSE response, a whole response and a raw PCM
stream in flight when it is signalled. The others serve in this process to reach states a
signal cannot time: a request arriving during shutdown, a client that does not read.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from omniflow.serve.ready import READY
from tests.serve.conftest import LiveServer, assert_released
from tests.serve.test_backpressure import slow_client, small_buffer_server

LONG = {
    "model": "qwen3-tts-tiny",
    "voice": "vivian",
    "input": "A long request that the shutdown interrupts.",
    "max_new_tokens": 2000,
    "ignore_eos": True,
}


def serve(*overrides: str) -> tuple[subprocess.Popen[str], str]:
    """`omniflow serve` in a session of its own: a signal to its process group reaches every
    process it started, as a service manager's or a terminal's does."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "omniflow", "serve", "server.port=0", *overrides],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:
        lines.append(line)
        if READY in line:
            text = "".join(lines)
            return proc, re.search(r"on (http://[\d.]+:\d+)", text).group(1)
    proc.kill()
    raise AssertionError("server did not start:\n" + "".join(lines))


def in_flight(url: str) -> int:
    return httpx.get(url + "/health").json()["in_flight"]


@pytest.mark.parametrize("runtime", ["in_process", "process"])
def test_sigterm_ends_running_responses_with_errors_and_exits_0(runtime):
    """SIGTERM to the whole process group; with the engine in its own process, that process
    leaves the signal to the server, which ends the requests, then stops it."""
    proc, url = serve(f"pipeline.runtime={runtime}")
    got: dict[str, object] = {}
    raw_started = threading.Event()

    def whole() -> None:
        r = httpx.post(
            url + "/v1/audio/speech", json={**LONG, "response_format": "wav"}, timeout=60
        )
        got["whole"] = r

    def raw() -> None:
        body = {**LONG, "response_format": "pcm", "stream": True}
        try:
            with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=60) as r:
                total = 0
                for chunk in r.iter_bytes():
                    total += len(chunk)
                    raw_started.set()  # its body has begun: shutdown must cut it short
                got["raw"] = total
        except httpx.RemoteProtocolError as exc:
            got["raw"] = exc

    threads = [threading.Thread(target=whole), threading.Thread(target=raw)]
    try:
        for t in threads:
            t.start()
        body = {**LONG, "response_format": "pcm", "stream_format": "sse"}
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=60) as r:
            lines = r.iter_lines()
            events = [json.loads(next(ln for ln in lines if ln.startswith("data:"))[5:])]
            deadline = time.monotonic() + 30
            while in_flight(url) < 3:  # all three admitted and generating
                assert time.monotonic() < deadline
                time.sleep(0.02)
            # A raw stream whose body has not begun gets the JSON 503 of a whole response;
            # this test is about one cut short mid-body, so wait for its first bytes.
            assert raw_started.wait(timeout=30)
            os.killpg(proc.pid, signal.SIGTERM)
            events += [json.loads(ln[5:]) for ln in lines if ln.startswith("data:")]
        for t in threads:
            t.join(timeout=30)
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
    log = proc.stderr.read() if proc.stderr else ""
    assert rc == 0, log
    assert events[0]["type"] == "speech.audio.delta"
    assert [e["type"] for e in events[1:-1]] == ["speech.audio.delta"] * (len(events) - 2)
    assert events[-1]["type"] == "speech.audio.error"
    assert "shutting down" in events[-1]["error"]["message"]
    whole_r = got["whole"]
    assert isinstance(whole_r, httpx.Response) and whole_r.status_code == 503, whole_r
    error = whole_r.json()["error"]
    assert error["code"] == "503" and "shutting down" in error["message"]
    # a raw stream has no error event: it is cut short, which the client sees
    assert isinstance(got["raw"], httpx.RemoteProtocolError), got["raw"]
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    assert "graceful shutdown exceeded" not in log and "stopping engines" in log


def test_during_shutdown_new_requests_and_health_answer_503():
    with LiveServer() as server:
        server.app.state.service.close()
        h = httpx.get(server.url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "shutting_down"
        r = httpx.post(server.url + "/v1/audio/speech", json={**LONG, "max_new_tokens": 2})
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
        assert server.pipeline.stats().in_flight == 0


def test_a_client_that_does_not_read_cannot_hold_the_shutdown():
    """Its request ends with the rest; the send it blocks gives up after the shutdown grace
    (2 s), not the stalled-client timeout (60 s by default), so the server stops."""
    server = small_buffer_server("server.max_buffered_audio_s=0.5")
    with server:
        response = slow_client(server, 2000)
        deadline = time.monotonic() + 30
        while server.pipeline.stats().stages[0].paused != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 10
    assert_released(server.pipeline.stats())
    response.close()


def test_the_shutdown_hook_is_the_servers():
    """`ServerThread` and `serve` run the same `Server` subclass, so the in-process tests
    above exercise what SIGTERM runs."""
    from omniflow.serve.run import Server

    with LiveServer() as server:
        assert isinstance(server.server, Server)
        assert server.sock.proto == socket.IPPROTO_TCP
