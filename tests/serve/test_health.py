"""A stage that has stopped is visible: /health answers 503 naming it, and new speech
requests get a 503 JSON error instead of hanging or failing one by one.

The server is the embedded default's (its `server` config), serving `FakePipeline`, which
has the orchestrator's public surface and can lose a stage on demand. To run these against
the real pipeline, make `pipeline()` return `build_pipeline(graph)` and `kill()` call the
orchestrator's test hook.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline

N = 5
BODY = {
    "model": "qwen3-tts-tiny",
    "voice": "vivian",
    "input": "Hello.",
    "response_format": "pcm",
    "max_new_tokens": N,
}


def pipeline(**kw) -> FakePipeline:
    return FakePipeline(**kw)


def kill(p: FakePipeline, stage: str) -> None:
    p.kill(stage)


@pytest.fixture
def served():
    p = pipeline()
    with ServerThread(p, compose(["platform=cpu"]).server) as server:
        yield server, p


def speech(url: str, **change) -> httpx.Response:
    return httpx.post(url + "/v1/audio/speech", json={**BODY, **change}, timeout=30)


def rejected(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    line = next(ln for ln in text.splitlines() if 'requests_total{outcome="rejected"}' in ln)
    return float(line.split()[-1])


def test_dead_stage_makes_health_and_new_requests_503(served):
    server, p = served
    h = httpx.get(server.url + "/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    ok = speech(server.url)
    assert ok.status_code == 200 and len(ok.content) == N * 1920 * 2

    kill(p, "code2wav")
    h = httpx.get(server.url + "/health")
    assert h.status_code == 503, h.text
    body = h.json()
    assert body["status"] == "unavailable" and body["down"] == ["code2wav"]
    assert "code2wav" in body["message"] and body["model"] == "qwen3-tts-tiny"

    submits, before = p.submits, rejected(server.url)
    r = speech(server.url)
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["type"] == "service_unavailable" and err["code"] == "503"
    assert "code2wav" in err["message"]
    assert p.submits == submits  # refused at admission: never handed to the pipeline
    assert rejected(server.url) == before + 1
    # the rest of the API still answers
    assert httpx.get(server.url + "/v1/models").status_code == 200


def test_stage_dying_at_submit_is_a_503_not_a_500(served):
    server, p = served
    p.die_at_next_submit("talker")
    r = speech(server.url)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "service_unavailable"
    assert "talker" in r.json()["error"]["message"]
    h = httpx.get(server.url + "/health")
    assert h.status_code == 503 and h.json()["down"] == ["talker"]


def test_running_requests_end_with_an_error_when_a_stage_dies(served):
    server, p = served
    p.gate.clear()
    results: list[httpx.Response] = []
    t = threading.Thread(target=lambda: results.append(speech(server.url)))
    t.start()
    wait_for(lambda: p.stats().in_flight == 1)
    kill(p, "talker")
    t.join(timeout=30)
    assert results[0].status_code == 500 and "killed" in results[0].json()["error"]["message"]
    assert p.stats().in_flight == 0


def metric(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def test_stage_gauges_follow_stats_and_exist_only_where_the_stage_has_them():
    p = pipeline(windows=True)
    with ServerThread(p, compose(["platform=cpu"]).server) as server:
        p.gate.clear()  # admitted, no audio yet: the gauges hold still
        threads = [threading.Thread(target=speech, args=(server.url,)) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: p.stats().in_flight == 2)
            text = httpx.get(server.url + "/metrics").text
        finally:
            p.gate.set()
            for t in threads:
                t.join(timeout=30)
        assert metric(text, 'omniflow_kv_blocks_in_use{stage="talker"}') == 2
        assert metric(text, 'omniflow_decoder_slots_in_use{stage="code2wav"}') == 2
        assert metric(text, 'omniflow_requests_running{stage="talker"}') == 2
        assert metric(text, 'omniflow_requests_running{stage="code2wav"}') == 2
        assert metric(text, 'omniflow_requests_waiting{stage="code2wav"}') == 0
        assert metric(text, 'omniflow_stream_slack_min_seconds{stage="talker"}') == 0.25
        assert 'omniflow_kv_blocks_in_use{stage="code2wav"}' not in text
        assert 'omniflow_decoder_slots_in_use{stage="talker"}' not in text
        text = httpx.get(server.url + "/metrics").text
        assert metric(text, 'omniflow_kv_blocks_in_use{stage="talker"}') == 0
        assert metric(text, 'omniflow_decoder_slots_in_use{stage="code2wav"}') == 0
        # windows: only the stage that has them; step times from the step observer
        assert metric(text, 'omniflow_window_planned_total{stage="talker"}') == p.steps
        assert metric(text, 'omniflow_window_refusals_total{reason="waiting",stage="talker"}') == 1
        assert metric(text, 'omniflow_window_sizes_total{stage="talker",steps="3"}') == p.steps
        assert "omniflow_stream_slack_min_seconds" not in text  # nothing playing now
        assert 'stage="code2wav"' not in "".join(
            ln for ln in text.splitlines() if ln.startswith("omniflow_window")
        )
        assert metric(text, 'omniflow_stage_step_seconds_count{stage="code2wav"}') == p.steps
        # prefill counters: the AR stage's only, each field its own series
        assert p.steps > 1
        assert metric(text, 'omniflow_prefill_steps_total{stage="talker"}') == p.steps
        assert metric(text, 'omniflow_prefill_tokens_total{stage="talker"}') == 7 * p.steps
        assert metric(text, 'omniflow_prefill_graphed_total{stage="talker"}') == p.steps - 1
        assert metric(text, 'omniflow_prefill_graph_replays_total{stage="talker"}') == 2 * p.steps
        assert "omniflow_prefill" not in "".join(
            ln for ln in text.splitlines() if 'stage="code2wav"' in ln
        )


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_real_pipeline_with_a_dead_stage_loop_answers_503():
    """The embedded default's real orchestrator: a fault escaping a stage's runner kills that
    stage's loop; the request in flight ends with an error, then /health and new requests
    answer 503 naming the stage."""
    from omniflow.build.pipeline import build_pipeline
    from omniflow.config.resolve import build_graph
    from tests.factories import tiny_bundle
    from tests.stages.test_dead_stage import kill_on_next_step

    spec = compose(["platform=cpu"])
    orch = build_pipeline(build_graph(spec), tiny_bundle())
    with ServerThread(orch, spec.server) as server:
        assert httpx.get(server.url + "/health").status_code == 200
        victim = orch.engines[0]
        hit = kill_on_next_step(victim)
        doomed = speech(server.url)
        assert hit.is_set()
        assert doomed.status_code == 500 and "injected fault" in doomed.text
        h = httpx.get(server.url + "/health")
        assert h.status_code == 503 and h.json()["down"] == [victim.name]
        r = speech(server.url)
        assert r.status_code == 503 and victim.name in r.json()["error"]["message"]
