"""`deploy=ray` on a local Ray cluster: two replicas of the tiny Base model behind Ray
Serve's proxy, on the session's cluster (its start and the two replicas' builds: ~10-20 s
on two cores). A voice registered through one replica is listed by and spoken with through
both; streams of every format pass through unchanged; concurrent requests reach both
replicas (the x-omniflow-replica header says which), and a burst sent at once is split
evenly by the least_loaded router (deploy/router.py); a seeded request gives the same PCM
from either replica as from `omniflow serve` in-process; a WebSocket session passes through
the proxy with the HTTP bytes of each sentence."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

# the dev extra installs both (omniflow[ray], openai): CI runs these tests
ray = pytest.importorskip("ray")
pytest.importorskip("openai")

from omniflow.config.compose import compose  # noqa: E402
from omniflow.config.resolve import build_graph  # noqa: E402
from omniflow.deploy.header import REPLICA_HEADER  # noqa: E402
from omniflow.deploy.settings import resolve_deploy  # noqa: E402
from tests.serve.helpers import LOW, openai_client  # noqa: E402

pytestmark = pytest.mark.ray

MODEL = "qwen3-tts-tiny-base"
TEXT = "Hello there, this is a test of the replicas."
SEEDED = {"seed": 11, "max_new_tokens": 12, "ignore_eos": True}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def url(ray_cluster):
    from ray import serve

    from omniflow.deploy.launch import start

    port = free_port()
    spec = compose(
        ["platform=cpu", "model=qwen3_tts_tiny_base", "deploy=ray", "deploy.replicas=2"]
        + [f"server.port={port}", "server.log_level=warning", "server.max_voices=3"]
        # routing and replicas are the subject, not admission by deadline: two replicas on a
        # shared 2-core CI machine can step slower than their audio, and would refuse (503)
        + ["server.max_first_audio_wait_s=null"]
    )
    deploy = resolve_deploy(spec.deploy, build_graph(spec))
    try:
        yield start(spec, deploy)
    finally:
        serve.shutdown()  # the replicas' CPUs back to the shared cluster


def register(url: str) -> httpx.Response:
    body = {"name": "me", "ref_audio": LOW, "ref_text": "A low tone."}
    return httpx.post(f"{url}/v1/audio/voices", json=body, timeout=60)


@pytest.fixture(scope="module")
def voice(url) -> str:
    response = register(url)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def until_both(call) -> dict[str, httpx.Response]:
    """`call()` one request at a time until both replicas have answered one."""
    seen: dict[str, httpx.Response] = {}
    for _ in range(30):
        response = call()
        seen[response.headers[REPLICA_HEADER]] = response
        if len(seen) == 2:
            return seen
    raise AssertionError(f"only {list(seen)} answered")


def check_a_voice_registered_through_one_replica_is_on_both(url, voice):
    listings = until_both(lambda: httpx.get(f"{url}/v1/audio/voices", timeout=30))
    for response in listings.values():
        assert response.json()["voices"] == [voice]
    spoken = until_both(lambda: openai_speech(url, voice))
    assert all(r.status_code == 200 and r.content for r in spoken.values())
    # max_voices bounds all replicas together: 3 in all, the 4th refused wherever it lands
    assert [register(url).status_code for _ in range(3)] == [201, 201, 409]
    extra = [v for v in httpx.get(f"{url}/v1/audio/voices").json()["voices"] if v != voice]
    deleted = [httpx.delete(f"{url}/v1/audio/voices/{v}").status_code for v in extra]
    assert deleted == [200, 200]
    assert httpx.get(f"{url}/v1/audio/voices").json()["voices"] == [voice]


def openai_speech(url: str, voice: str) -> httpx.Response:
    """A streamed PCM request through the real `openai` client (its raw httpx response)."""
    client = openai_client(url)
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, voice=voice, input=TEXT, response_format="pcm", extra_body=SEEDED
    ) as response:
        response.read()
        return response.http_response


def speech(url: str, **body) -> httpx.Response:
    body = {"model": MODEL, "input": TEXT, **body}
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{url}/v1/audio/speech", json=body) as response,
    ):
        response.read()
        return response


def check_concurrent_streams_of_every_format_reach_both_replicas(url, voice):
    kinds = [
        {"response_format": "pcm", "stream": True},
        {"response_format": "wav", "stream": True},
        {"response_format": "mp3", "stream": True},
        {"response_format": "pcm", "stream_format": "sse"},
    ] * 3
    with ThreadPoolExecutor(len(kinds)) as pool:
        responses = list(pool.map(lambda kind: speech(url, voice=voice, **kind), kinds))
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


def check_a_burst_sent_at_once_is_split_evenly(url, voice):
    """Six streams sent at the same instant: 3 to each replica (Ray Serve's default router
    split such a burst 5:1, its in-flight counts lagging; least_loaded counts each request
    as it routes it)."""
    import threading

    deadline = time.monotonic() + 30  # the streams before it ended on both replicas
    while httpx.get(f"{url}/health", timeout=30).json()["in_flight"]:
        assert time.monotonic() < deadline, "the replicas never went idle"
        time.sleep(0.1)
    gate = threading.Barrier(6)
    body = {"voice": voice, "response_format": "pcm", "stream": True, "ignore_eos": True}

    def one(_: int) -> str:
        gate.wait()
        return speech(url, **body, max_new_tokens=40).headers[REPLICA_HEADER]

    with ThreadPoolExecutor(6) as pool:
        replicas = list(pool.map(one, range(6)))
    assert sorted(replicas.count(r) for r in set(replicas)) == [3, 3], replicas


def check_seeded_pcm_is_the_same_from_either_replica_and_in_process(url, voice):
    from tests.serve.conftest import LiveServer

    def pcm(at: str, voice: str) -> httpx.Response:
        return speech(at, voice=voice, response_format="pcm", stream=True, **SEEDED)

    by_replica = until_both(lambda: pcm(url, voice))  # each alone in its batch
    with LiveServer("model=qwen3_tts_tiny_base") as local:
        expected = pcm(local.url, register(local.url).json()["id"])
        assert REPLICA_HEADER not in expected.headers  # in-process: no replica header
    for response in by_replica.values():
        assert response.status_code == 200, response.text
        assert response.content == expected.content


def check_health_and_metrics_cover_both_replicas(url, voice):
    deadline = time.monotonic() + 10
    while True:  # each replica reports every second
        health = httpx.get(f"{url}/health", timeout=30)
        if len(health.json().get("replicas", {})) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert health.status_code == 200, health.text
    body = health.json()
    assert body["status"] == "ok" and body["model"] == MODEL and body["in_flight"] == 0
    assert all(r["status"] == "ok" for r in body["replicas"].values())
    assert health.headers[REPLICA_HEADER] in body["replicas"]
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    for name in body["replicas"]:
        assert f'omniflow_replica_up{{replica="{name}"}} 1' in metrics
        assert f'omniflow_requests_total{{replica="{name}",' in metrics
    assert metrics.count("# TYPE omniflow_requests_total counter") == 1
    models = httpx.get(f"{url}/v1/models", timeout=30).json()
    assert models["data"][0]["id"] == MODEL


def check_a_websocket_session_passes_through_the_proxy(url, voice):
    """WS /v1/audio/speech/stream through Serve's proxy with the registered voice (the
    vLLM-Omni protocol: two sentences split across deltas, then a second utterance on the
    same socket): the events, and each sentence's audio that of the same text over HTTP
    (seeded: either replica gives it)."""
    from websockets.sync.client import connect

    from tests.serve.test_websocket import configure, done, recv, text

    settings = {"voice": voice, "seed": 5, "max_new_tokens": 12, "ignore_eos": True}
    ws_url = url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    sentences: list[tuple[str, bytes]] = []
    with connect(ws_url) as ws:
        configure(ws, response_format="pcm", **settings)
        for pieces in (["Hello ", "there. How a", "re you?"], ["Once more."]):
            for piece in pieces:
                text(ws, piece)
            done(ws)
            while (message := json.loads(recv(ws)))["type"] != "session.done":
                assert message["type"] == "audio.start", message
                audio = b""
                while isinstance(part := recv(ws), bytes):
                    audio += part
                end = json.loads(part)
                assert end["type"] == "audio.done" and end["error"] is False, end
                assert end["total_bytes"] == len(audio) > 0
                sentences.append((message["sentence_text"], audio))
    assert [t for t, _ in sentences] == ["Hello there.", "How are you?", "Once more."]
    for sentence, audio in sentences:
        whole = speech(url, input=sentence, response_format="pcm", **settings)
        assert whole.status_code == 200, whole.text
        assert audio == whole.content, sentence


def check_a_replica_killed_mid_stream_cuts_its_streams_alone_and_is_replaced(url, voice):
    """Last in the module: it kills a replica. Its streams end cut short (one error each:
    a raw stream's 200 has gone out), the other replica's complete and it keeps serving,
    /health says degraded meanwhile, and Ray Serve starts a new replica."""
    import queue
    import threading

    body = {"model": MODEL, "input": TEXT, "voice": voice, "response_format": "pcm"}
    body |= {"stream": True, "max_new_tokens": 300, "ignore_eos": True, "seed": 1}
    started: queue.Queue = queue.Queue()
    ends: dict[int, tuple[str, str]] = {}

    def one(i: int) -> None:
        with (
            httpx.Client(timeout=120) as client,
            client.stream("POST", f"{url}/v1/audio/speech", json=body) as response,
        ):
            replica = response.headers[REPLICA_HEADER]
            chunks = response.iter_bytes()
            next(chunks)
            started.put(replica)
            try:
                for _ in chunks:
                    pass
                ends[i] = (replica, "complete")
            except httpx.RemoteProtocolError:
                ends[i] = (replica, "cut")

    threads = []
    for i in range(4):  # opened one after the other: the router sees each one's load
        threads.append(threading.Thread(target=one, args=(i,), daemon=True))
        threads[-1].start()
        started.get(timeout=60)
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    replicas = {n.rsplit("#", 1)[-1]: n for n in names if n.startswith("SERVE_REPLICA::")}
    assert len(replicas) == 2, names
    victim = sorted(replicas)[0]
    ray.kill(ray.get_actor(replicas[victim], namespace="serve"), no_restart=True)

    def health() -> dict:
        return httpx.get(f"{url}/health", timeout=30).json()

    deadline = time.monotonic() + 10  # unheard from for STALE_S, not yet replaced
    while (now := health())["replicas"].get(victim, {}).get("status") != "unreachable":
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    assert now["status"] == "degraded"
    for thread in threads:
        thread.join(timeout=120)
    assert len(ends) == 4, ends
    assert {state for replica, state in ends.values() if replica == victim} == {"cut"}
    assert {state for replica, state in ends.values() if replica != victim} == {"complete"}
    assert speech(url, voice=voice, response_format="pcm", **SEEDED).status_code == 200
    deadline = time.monotonic() + 60
    while (now := health())["status"] != "ok":  # the new replica built and reporting
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    assert len(now["replicas"]) == 2 and victim not in now["replicas"]


def test_two_replicas_behind_one_port(url, voice):
    """The checks above, in this order, in one test: one cluster for all of them even when
    pytest-xdist would hand a module's tests to different workers (each would start its
    own cluster), and the replica kill last."""
    check_a_voice_registered_through_one_replica_is_on_both(url, voice)
    check_concurrent_streams_of_every_format_reach_both_replicas(url, voice)
    check_a_burst_sent_at_once_is_split_evenly(url, voice)
    check_seeded_pcm_is_the_same_from_either_replica_and_in_process(url, voice)
    check_health_and_metrics_cover_both_replicas(url, voice)
    check_a_websocket_session_passes_through_the_proxy(url, voice)
    check_a_replica_killed_mid_stream_cuts_its_streams_alone_and_is_replaced(url, voice)
