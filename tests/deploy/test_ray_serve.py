"""`deploy=ray` on a local Ray cluster: two replicas of the tiny model behind Ray Serve's
proxy, one cluster for the module (its start and the two replicas' builds: ~20 s on two
cores). Streams of every format pass through unchanged, concurrent requests reach both
replicas (the x-omniflow-replica header says which), and a seeded request gives the same
PCM from either replica as from `omniflow serve` in-process."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.deploy.header import REPLICA_HEADER
from omniflow.deploy.settings import resolve_deploy

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

MODEL = "qwen3-tts-tiny"
TEXT = "Hello there, this is a test of the replicas."
SEEDED = {"seed": 11, "max_new_tokens": 12, "ignore_eos": True}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def url():
    from ray import serve

    from omniflow.deploy.launch import start

    port = free_port()
    spec = compose(
        ["platform=cpu", "deploy=ray", "deploy.replicas=2", f"server.port={port}"]
        + ["server.log_level=warning"]
    )
    deploy = resolve_deploy(spec.deploy, build_graph(spec))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield start(spec, deploy)
    finally:
        serve.shutdown()
        ray.shutdown()


def speech(url: str, **body) -> httpx.Response:
    body = {"model": MODEL, "input": TEXT, **body}
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{url}/v1/audio/speech", json=body) as response,
    ):
        response.read()
        return response


def test_concurrent_streams_of_every_format_reach_both_replicas(url):
    kinds = [
        {"response_format": "pcm", "stream": True},
        {"response_format": "wav", "stream": True},
        {"response_format": "mp3", "stream": True},
        {"response_format": "pcm", "stream_format": "sse"},
    ] * 3
    with ThreadPoolExecutor(len(kinds)) as pool:
        responses = list(pool.map(lambda kind: speech(url, **kind), kinds))
    for kind, response in zip(kinds, responses, strict=True):
        assert response.status_code == 200, response.text
        assert response.headers.get("transfer-encoding") == "chunked", kind  # streamed
        body = response.content
        if kind.get("stream_format") == "sse":
            events = [json.loads(line[6:]) for line in body.decode().split("\n") if line]
            assert events[0]["type"] == "speech.audio.delta"
            assert events[-1]["type"] == "speech.audio.done"
        elif kind["response_format"] == "wav":
            assert body[:4] == b"RIFF" and len(body) > 44
        elif kind["response_format"] == "mp3":
            assert body[:3] == b"ID3" or body[0] == 0xFF
        else:
            assert len(body) % 2 == 0 and len(body) > 0
    replicas = {r.headers[REPLICA_HEADER] for r in responses}
    assert len(replicas) == 2, replicas


def test_seeded_pcm_is_the_same_from_either_replica_and_in_process(url):
    from tests.serve.conftest import LiveServer

    by_replica: dict[str, bytes] = {}
    for _ in range(20):  # one at a time (each alone in its batch), until both have answered
        response = speech(url, response_format="pcm", stream=True, **SEEDED)
        assert response.status_code == 200, response.text
        by_replica[response.headers[REPLICA_HEADER]] = response.content
        if len(by_replica) == 2:
            break
    assert len(by_replica) == 2, by_replica.keys()
    with LiveServer() as local:
        expected = speech(local.url, response_format="pcm", stream=True, **SEEDED).content
        assert REPLICA_HEADER not in speech(local.url, input="Hi.").headers  # local: none
    assert all(pcm == expected for pcm in by_replica.values())


def test_health_and_models_answer_through_the_proxy(url):
    health = httpx.get(f"{url}/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert REPLICA_HEADER in health.headers
    models = httpx.get(f"{url}/v1/models", timeout=30).json()
    assert models["data"][0]["id"] == MODEL
