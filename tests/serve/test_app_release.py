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


def test_a_stopped_base_model_server_releases_its_pipeline_after_every_kind_of_request():
    """The real tiny Base pipeline through uvicorn: a registered voice, a clone from a
    recording, a streamed response the client leaves after its first bytes, a refused body,
    a 404 and a 405, then the server stops. Nothing the voice registry, the reference
    encoder, an aborted response or the router's error path made still reaches the
    pipeline."""
    import httpx

    from tests.serve.conftest import LiveServer
    from tests.serve.helpers import audio_file, b64

    def serve() -> weakref.ref:
        server = LiveServer("model=qwen3_tts_tiny_base")
        with server:
            url = server.url
            voice = {"name": "me", "ref_audio": b64(audio_file()), "ref_text": "A tone."}
            made = httpx.post(url + "/v1/audio/voices", json=voice, timeout=60)
            assert made.status_code == 201
            vid = made.json()["id"]
            body = {"model": "qwen3-tts-tiny-base", "input": "Hi.", "max_new_tokens": 2}
            ok = httpx.post(url + "/v1/audio/speech", json={**body, "voice": vid}, timeout=60)
            assert ok.status_code == 200 and ok.content
            clone = {**body, "ref_audio": voice["ref_audio"], "ref_text": "A tone."}
            assert httpx.post(url + "/v1/audio/speech", json=clone, timeout=60).status_code == 200
            long = {**body, "voice": vid, "max_new_tokens": 40, "ignore_eos": True}
            streamed = {**long, "stream": True, "response_format": "pcm"}
            with httpx.stream("POST", url + "/v1/audio/speech", json=streamed, timeout=60) as r:
                assert r.status_code == 200
                next(r.iter_bytes())  # then leave: the request is aborted
            bad = httpx.post(url + "/v1/audio/speech", json={"input": 3}, timeout=60)
            assert bad.status_code == 400
            assert httpx.get(url + "/nowhere", timeout=60).status_code == 404
            assert httpx.put(url + f"/v1/audio/voices/{vid}", timeout=60).status_code == 405
            server.wait_idle()
        return weakref.ref(server.pipeline)

    ref = serve()
    gc.collect()
    assert ref() is None, "the Base model's pipeline is still reachable"
