"""A served app lets go of its pipeline once the app is dropped: nothing process-wide keeps
it. FastAPI caches facts about endpoint functions in module-level caches keyed by the
function, so an endpoint that closes over the service (and the service over the pipeline)
would keep every pipeline a process ever served alive, with its weights, KV pools and CUDA
graphs. A sweep of `omniflow bench` builds a pipeline whenever the stage graph changes, in one
process; on the GPU the fourth such build ran out of memory."""

from __future__ import annotations

import gc
import weakref

from starlette.testclient import TestClient

from omniflow.config.compose import compose
from omniflow.serve.routes import build_app
from tests.serve.fake_pipeline import FakePipeline


def serve_once() -> weakref.ref[FakePipeline]:
    """Build an app over a fresh pipeline, touch every kind of route, drop both."""
    pipe = FakePipeline()
    pipe.start()
    app = build_app(pipe, compose(["platform=cpu"]).server)
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/v1/models/qwen3-tts-tiny").status_code == 200
        assert client.get("/v1/audio/voices").status_code == 200
        assert client.get("/metrics").status_code == 200
        body = {"model": "qwen3-tts-tiny", "voice": "vivian", "input": "hi", "max_new_tokens": 2}
        r = client.post("/v1/audio/speech", json={**body, "response_format": "pcm"})
        assert r.status_code == 200 and len(r.content) > 0
    pipe.stop()
    return weakref.ref(pipe)


def test_a_dropped_app_releases_its_pipeline():
    first = serve_once()
    second = serve_once()  # the same endpoints again: a cache keyed by them is refreshed
    gc.collect()
    assert first() is None, "the first app's pipeline is still reachable"
    assert second() is None, "the second app's pipeline is still reachable"
