"""The speech API over real HTTP on loopback, with the real openai client."""

from __future__ import annotations

import base64
import io
import json
import threading

import httpx
import numpy as np
import pytest
import soundfile

from omniflow.bench.open_client import server_build
from omniflow.provenance import build
from tests.serve.conftest import assert_released
from tests.serve.helpers import openai_client

MODEL = "qwen3-tts-tiny"
N = 20
PCM_BYTES = N * 1920 * 2
EXTRA = {"seed": 3, "max_new_tokens": N, "ignore_eos": True}


def client(live):
    return openai_client(live.url)


def speech_stream(live, fmt: str) -> bytes:
    with client(live).audio.speech.with_streaming_response.create(
        model=MODEL,
        voice="vivian",
        input="Hello from the OpenAI client.",
        response_format=fmt,
        extra_body=EXTRA,
    ) as response:
        return b"".join(response.iter_bytes())


def test_openai_client_pcm_wav_and_sse_agree(live):
    pcm = speech_stream(live, "pcm")
    assert len(pcm) == PCM_BYTES
    wav = speech_stream(live, "wav")
    assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE"
    assert wav[44:] == pcm
    # streamed variants of the same request
    with httpx.stream(
        "POST",
        live.url + "/v1/audio/speech",
        timeout=60,
        json={
            "model": MODEL,
            "voice": "vivian",
            "input": "Hello from the OpenAI client.",
            "response_format": "pcm",
            "stream_format": "sse",
            **EXTRA,
        },
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == pcm
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_frames"] == N
    with httpx.stream(
        "POST",
        live.url + "/v1/audio/speech",
        timeout=60,
        json={
            "model": MODEL,
            "voice": "vivian",
            "input": "Hello from the OpenAI client.",
            "response_format": "wav",
            "stream": True,
            **EXTRA,
        },
    ) as r:
        body = b"".join(r.iter_bytes())
    assert body[:4] == b"RIFF" and body[44:] == pcm


@pytest.mark.parametrize("fmt", ["flac", "mp3", "opus"])
def test_encoded_formats_decode_back(live, fmt):
    r = httpx.post(
        live.url + "/v1/audio/speech",
        timeout=60,
        json={
            "model": MODEL,
            "voice": "ryan",
            "input": "Encoded.",
            "response_format": fmt,
            **EXTRA,
        },
    )
    assert r.status_code == 200, r.text
    audio, sr = soundfile.read(io.BytesIO(r.content))
    assert sr == 24000
    assert abs(len(audio) - N * 1920) <= 2000  # mp3/opus add encoder padding
    if fmt == "flac":
        pcm = httpx.post(
            live.url + "/v1/audio/speech",
            timeout=60,
            json={
                "model": MODEL,
                "voice": "ryan",
                "input": "Encoded.",
                "response_format": "pcm",
                **EXTRA,
            },
        ).content
        ref = np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768.0
        assert np.allclose(audio, ref, atol=1e-4)


def test_sixteen_concurrent_streams_and_one_disconnect():
    """Every stream completes beside a client that hangs up. Without the first-audio limit:
    on a loaded 2-core machine the admission estimate may refuse some (a 503 is right there,
    and tests/serve/test_admission_deadline.py covers it), which is not what this test is about."""
    from tests.serve.conftest import LiveServer

    with LiveServer("server.max_first_audio_wait_s=null") as live:
        _sixteen_streams_and_one_disconnect(live)


def _sixteen_streams_and_one_disconnect(live) -> None:
    results: dict[int, int] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            body = {
                "model": MODEL,
                "voice": "vivian",
                "input": f"Concurrent request {i}.",
                "response_format": "pcm",
                "stream": True,
                "seed": i,
                "max_new_tokens": 12 + i,
                "ignore_eos": True,
            }
            with httpx.stream("POST", live.url + "/v1/audio/speech", json=body, timeout=120) as r:
                assert r.status_code == 200
                results[i] = sum(len(c) for c in r.iter_bytes())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    def quitter() -> None:
        body = {
            "model": MODEL,
            "voice": "vivian",
            "input": "I will hang up.",
            "response_format": "pcm",
            "stream": True,
            "max_new_tokens": 2000,
            "ignore_eos": True,
        }
        with httpx.stream("POST", live.url + "/v1/audio/speech", json=body, timeout=120) as r:
            got = 0
            for chunk in r.iter_bytes():
                got += len(chunk)
                if got > 5 * 1920 * 2:
                    break  # leaving the block closes the connection mid-stream

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    q = threading.Thread(target=quitter)
    q.start()
    for t in threads:
        t.start()
    for t in [q, *threads]:
        t.join(timeout=180)
    assert not errors, errors
    assert results == {i: (12 + i) * 1920 * 2 for i in range(16)}
    live.wait_idle()
    assert_released(live.pipeline.stats())
    metrics = httpx.get(live.url + "/metrics").text
    assert 'omniflow_requests_total{outcome="abort"} 1.0' in metrics


BAD = [
    ({"input": ""}, 400, "input"),
    ({"input": "x" * 5000}, 400, "input"),
    ({"voice": "nobody"}, 400, "voice"),
    ({"language": "klingon"}, 400, "language"),
    ({"response_format": "aac"}, 400, "response_format"),
    ({"response_format": "wma"}, 400, "response_format"),
    ({"speed": 0.2}, 400, "speed"),
    ({"speed": 9.0}, 400, "speed"),
    ({"max_new_tokens": 0}, 400, "max_new_tokens"),
    ({"max_new_tokens": 10**9}, 400, "max_new_tokens"),
    ({"seed": -1}, 400, "seed"),
    ({"instructions": "x" * 5000}, 400, "instructions"),
    ({"task_type": "Base"}, 400, "task_type"),
    ({"stream": True, "response_format": "flac"}, 400, "response_format"),
    ({"stream_format": "sse", "response_format": "mp3"}, 400, "response_format"),
    ({"unknown_field": 1}, 400, "unknown_field"),
    ({"model": "tts-1"}, 404, "model"),
]


@pytest.mark.parametrize(("change", "status", "param"), BAD)
def test_bad_input_gets_4xx_json_and_the_server_keeps_serving(live, change, status, param):
    body = {"model": MODEL, "voice": "vivian", "input": "ok", **change}
    r = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]
    ok = httpx.post(
        live.url + "/v1/audio/speech",
        timeout=60,
        json={
            "model": MODEL,
            "voice": "vivian",
            "input": "still here",
            "response_format": "pcm",
            "max_new_tokens": 2,
            "ignore_eos": True,
        },
    )
    assert ok.status_code == 200 and len(ok.content) == 2 * 1920 * 2


@pytest.mark.parametrize("fmt", ["ogg", "aac"])
def test_an_unknown_format_lists_only_formats_that_work(live, fmt):
    body = {"model": MODEL, "voice": "vivian", "input": "ok", "response_format": fmt}
    r = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=30)
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "'opus'" in message and "aac" not in message, message


def test_malformed_and_missing_fields(live):
    r = httpx.post(live.url + "/v1/audio/speech", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = httpx.post(live.url + "/v1/audio/speech", json={"model": MODEL}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] in ("input", "voice")


def test_info_endpoints_and_metrics(live):
    models = httpx.get(live.url + "/v1/models").json()
    assert models["data"][0]["id"] == MODEL
    voices = httpx.get(live.url + "/v1/audio/voices").json()
    assert "vivian" in voices["voices"] and "ryan" in voices["voices"]
    health = httpx.get(live.url + "/health").json()
    assert health["status"] == "ok"
    # which build answers: the open-loop client records it beside its figures
    assert health["build"] == build() and len(health["build"]["tree"]) == 12
    assert server_build(live.url) == health["build"]
    speech_stream(live, "pcm")
    text = httpx.get(live.url + "/metrics").text
    for series in (
        "omniflow_requests_total",
        "omniflow_requests_in_flight",
        "omniflow_audio_seconds_total",
        "omniflow_first_audio_seconds_bucket",
        "omniflow_e2e_seconds_bucket",
        'omniflow_stage_step_seconds_bucket{le="0.01",stage="talker"}',
        'omniflow_kv_blocks_in_use{stage="talker"}',
        'omniflow_decoder_slots_in_use{stage="talker"}',
        'omniflow_requests_running{stage="talker"}',
        'omniflow_requests_waiting{stage="talker"}',
    ):
        assert series in text, series
