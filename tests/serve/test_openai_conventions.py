"""OpenAI's conventions as its SDK and its users expect them: `stream_format="audio"` streams
(mp3 included, OpenAI's default format), a model can be fetched by id, `created` is a time,
and `/docs` documents the speech request."""

from __future__ import annotations

import io
import time

import httpx
import numpy as np
import soundfile

from tests.serve.helpers import openai_client

MODEL = "qwen3-tts-tiny"
N = 20
EXTRA = {"seed": 3, "max_new_tokens": N, "ignore_eos": True}


def whole_pcm(live) -> bytes:
    """The same request's PCM, answered whole (not streamed)."""
    return httpx.post(
        live.url + "/v1/audio/speech",
        timeout=60,
        json={
            "model": MODEL,
            "voice": "vivian",
            "input": "Hello there.",
            "response_format": "pcm",
            **EXTRA,
        },
    ).content


def stream(live, fmt: str) -> tuple[httpx.Headers, list[bytes]]:
    """The SDK's streaming call with stream_format="audio", chunk by chunk."""
    client = openai_client(live.url)
    with client.audio.speech.with_streaming_response.create(
        model=MODEL,
        voice="vivian",
        input="Hello there.",
        response_format=fmt,
        stream_format="audio",
        extra_body=EXTRA,
    ) as response:
        return response.headers, list(response.iter_bytes(chunk_size=None))


def test_stream_format_audio_streams_pcm(live):
    headers, chunks = stream(live, "pcm")
    assert "content-length" not in headers  # sent as it was produced, not whole
    assert headers["transfer-encoding"] == "chunked"
    assert sum(map(len, chunks)) == N * 1920 * 2
    assert b"".join(chunks) == whole_pcm(live)


def test_stream_false_with_stream_format_audio_is_a_whole_file(live):
    """vLLM-Omni's client model sends both by default and means a whole response."""
    body = {"model": MODEL, "voice": "vivian", "input": "Hello there.", **EXTRA}
    body |= {"response_format": "wav", "stream": False, "stream_format": "audio"}
    r = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers.get("content-length") == str(len(r.content))  # not chunked
    audio, rate = soundfile.read(io.BytesIO(r.content), dtype="int16")
    assert rate == 24000 and len(audio) == N * 1920  # the WAV header states its length
    sse = httpx.post(live.url + "/v1/audio/speech", json=body | {"stream_format": "sse"})
    assert sse.status_code == 400 and sse.json()["error"]["param"] == "stream"


def test_mp3_streams_through_a_real_encoder(live):
    headers, chunks = stream(live, "mp3")
    assert headers["content-type"] == "audio/mpeg"
    assert "content-length" not in headers
    body = b"".join(chunks)
    assert body[0] == 0xFF and body[1] & 0xE0 == 0xE0  # an MPEG audio frame's sync word
    audio, sr = soundfile.read(io.BytesIO(body), dtype="float32")
    assert sr == 24000
    assert abs(len(audio) - N * 1920) <= 2 * 1152  # LAME's encoder delay and padding
    # the same bytes as the whole mp3 of the same request, so the same length (issue 36:
    # the stream was 0.936 s where the whole file was 0.880 s)
    whole = httpx.post(
        live.url + "/v1/audio/speech",
        timeout=60,
        json={"model": MODEL, "voice": "vivian", "input": "Hello there.", "response_format": "mp3"}
        | EXTRA,
    )
    assert whole.content == body
    assert len(soundfile.read(io.BytesIO(whole.content))[0]) == len(audio)
    pcm = whole_pcm(live)
    # the same audio (lossy): energy within a few percent
    ref = np.frombuffer(pcm, "<i2").astype(np.float32) / 32767
    assert abs(np.sqrt(np.mean(audio**2)) / np.sqrt(np.mean(ref**2)) - 1) < 0.1


def test_sse_mp3_is_refused_with_the_way_to_stream_it(live):
    r = httpx.post(
        live.url + "/v1/audio/speech",
        timeout=30,
        json={
            "model": MODEL,
            "voice": "vivian",
            "input": "x",
            "response_format": "mp3",
            "stream_format": "sse",
        },
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "response_format" and "stream_format 'audio'" in err["message"]


def test_a_model_by_id_and_its_creation_time(live):
    listed = httpx.get(live.url + "/v1/models").json()["data"][0]
    one = httpx.get(live.url + f"/v1/models/{MODEL}")
    assert one.status_code == 200 and one.json() == listed
    assert abs(listed["created"] - time.time()) < 3600  # a Unix time, not 0
    missing = httpx.get(live.url + "/v1/models/tts-1")
    assert missing.status_code == 404
    assert missing.json()["error"]["param"] == "model"


def test_docs_show_the_speech_request_schema(live):
    spec = httpx.get(live.url + "/openapi.json").json()
    body = spec["paths"]["/v1/audio/speech"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert {"model", "input"} <= set(schema["required"])
    assert "voice" not in schema["required"]  # a voice clone (task_type Base) names none
    assert "ref_audio" in schema["properties"]
    assert "stream_format" in schema["properties"] and "response_format" in schema["properties"]
    assert schema["additionalProperties"] is False
    assert httpx.get(live.url + "/docs").status_code == 200


def test_a_request_without_a_voice_speaks_with_synth_s_default(live):
    """One default for the server and synth (issue 36): no voice is vivian."""
    r = httpx.post(
        live.url + "/v1/audio/speech",
        timeout=60,
        json={"model": MODEL, "input": "Hello there.", "response_format": "pcm", **EXTRA},
    )
    assert r.status_code == 200, r.text
    assert r.content == whole_pcm(live)


def test_every_error_of_a_request_is_in_its_400(live):
    r = httpx.post(
        live.url + "/v1/audio/speech",
        timeout=30,
        json={"model": MODEL, "input": " ", "language": "klingon", "ignore_eos": True},
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "input" and err["message"].startswith("3 errors: ")
    assert "klingon" in err["message"] and "ignore_eos" in err["message"]
    assert [e["field"] for e in err["errors"]] == ["input", "language", "ignore_eos"]


def test_the_schema_s_errors_and_the_model_s_come_in_one_400(live):
    """Issue 36 item 11: fields the schema refuses (a string seed, an unknown format, an
    unknown field) do not hide the served model's rules for the others, nor each other."""
    r = httpx.post(
        live.url + "/v1/audio/speech",
        timeout=30,
        json={
            "model": MODEL,
            "input": " ",
            "voice": "nobody",
            "response_format": "ogg",
            "language": "klingon",
            "seed": "7",
            "ignore_eos": True,
            "colour": "blue",
        },
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    fields = [e["field"] for e in err["errors"]]
    assert fields == [
        "input",
        "voice",
        "response_format",
        "language",
        "seed",
        "ignore_eos",
        "colour",
    ]
    assert err["param"] == "input" and err["type"] == "invalid_request_error"
    assert err["message"].startswith("7 errors: input is empty")
    for e in err["errors"]:
        assert e["message"] in err["message"]
