"""The server gives the allocator's free memory back once it goes idle (`IdleRelease`).

docs/reliability.md ("Resident memory") has the soak figures: resident memory levels off
after the first rounds, and ~30-40 MB of it is heap that glibc keeps after it was freed;
`malloc_trim(0)` returns that. These tests check when the server calls it (after the last
running request ends and `idle_s` passes, never while a request runs) and that the call
returns freed heap on this platform.
"""

from __future__ import annotations

import os
import threading

import httpx

from omniflow.core.heap import malloc_trim
from tests.serve.conftest import LiveServer

IDLE_S = 0.3


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_free_memory_is_returned_once_the_server_is_idle_and_not_before():
    with LiveServer() as server:
        trim = server.app.state.idle_trim
        release = trim.release
        assert release is not None  # glibc: the server does trim
        in_flight_at_trim: list[int] = []
        trimmed = threading.Event()

        def recording_release() -> None:
            in_flight_at_trim.append(server.pipeline.stats().in_flight)
            release()
            trimmed.set()

        trim.release, trim.idle_s = recording_release, IDLE_S
        body = {"model": "qwen3-tts-tiny", "voice": "vivian", "input": "Hi.", "max_new_tokens": 2}
        with httpx.Client(timeout=60) as client:
            assert client.post(server.url + "/v1/audio/speech", json=body).status_code == 200
            # At once another request, streamed and held open (unread) for longer than
            # idle_s: the server is busy the whole time, so nothing may be trimmed.
            long = body | {"max_new_tokens": 2000, "ignore_eos": True, "stream": True}
            with client.stream("POST", server.url + "/v1/audio/speech", json=long) as r:
                assert r.status_code == 200
                assert not trimmed.wait(3 * IDLE_S), in_flight_at_trim
            # The client closed the stream: the request is aborted, the server goes idle.
            assert trimmed.wait(30)
        server.wait_idle()
    assert in_flight_at_trim == [0]


def test_malloc_trim_returns_freed_heap_to_the_system():
    release = malloc_trim()
    assert release is not None
    release()  # heap freed by earlier tests in this process would be reused by the blocks
    before = resident_mb()
    blocks = [bytes(1024) for _ in range(65536)]  # 64 MiB from malloc (past pymalloc's 512 B)
    pin = bytes(1024)  # above them in the heap: free() alone cannot shrink the heap's top
    del blocks
    kept = resident_mb()
    release()
    after = resident_mb()
    assert kept - before > 48, (before, kept)  # freed, and still resident
    assert kept - after > 48, (kept, after)  # returned by the trim
    del pin
