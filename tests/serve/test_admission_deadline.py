"""Admission by deadline (`server.max_first_audio_wait_s`): a request the pipeline could not
seat in time is refused at once with a 503 JSON and Retry-After, counted on /metrics by
reason, and other requests keep being served."""

from __future__ import annotations

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline
from tests.serve.test_health import BODY, N, speech


def refused(url: str, reason: str) -> float:
    text = httpx.get(url + "/metrics").text
    key = f'omniflow_refusals_total{{reason="{reason}"}}'
    return float(next(ln for ln in text.splitlines() if ln.startswith(key)).split()[-1])


@pytest.fixture
def served():
    p = FakePipeline()
    with ServerThread(
        p, compose(["platform=cpu", "server.max_first_audio_wait_s=0.5"]).server
    ) as s:
        yield s, p


def test_a_request_that_would_wait_too_long_gets_503_with_retry_after(served):
    server, p = served
    assert speech(server.url).status_code == 200
    assert p.max_wait_s == 0.5  # the server hands its limit to the pipeline
    p.seat_wait_s = 2.3
    before = refused(server.url, "first_audio_wait")
    r = speech(server.url)
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "3"  # whole seconds, rounded up
    err = r.json()["error"]
    assert err["type"] == "overloaded_error" and "capacity" in err["message"]
    assert refused(server.url, "first_audio_wait") == before + 1
    p.seat_wait_s = 0.1  # the queue drained: served again
    ok = speech(server.url)
    assert ok.status_code == 200 and len(ok.content) == N * 1920 * 2


def test_null_limit_queues_instead_of_refusing():
    p = FakePipeline()
    p.seat_wait_s = 60.0
    cfg = compose(["platform=cpu", "server.max_first_audio_wait_s=null"]).server
    with ServerThread(p, cfg) as server:
        r = httpx.post(server.url + "/v1/audio/speech", json=BODY, timeout=30)
        assert r.status_code == 200
        assert p.max_wait_s is None
