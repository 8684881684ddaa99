"""`non_streaming_mode` over HTTP (the field other frameworks' clients send) reaches the
prompt: the two layouts give different audio for the same seed, unset is the default layout,
and the languages offered leave out the dialects."""

from __future__ import annotations

import httpx

from tests.serve.helpers import openai_client

N = 6


def pcm(live, **extra) -> bytes:
    client = openai_client(live.url)
    body = {"seed": 5, "max_new_tokens": N, "ignore_eos": True, **extra}
    with client.audio.speech.with_streaming_response.create(
        model="qwen3-tts-tiny",
        voice="vivian",
        input="Layouts.",
        response_format="pcm",
        extra_body=body,
    ) as response:
        return b"".join(response.iter_bytes())


def test_non_streaming_mode_picks_the_prompt_layout(live):
    whole, stream, default = (
        pcm(live, non_streaming_mode=True),
        pcm(live, non_streaming_mode=False),
        pcm(live),
    )
    assert len(whole) == len(stream) == N * 1920 * 2
    assert whole != stream
    assert default == whole  # unset: the whole-text layout (docs/reference.md)


def test_dialects_are_not_offered_as_languages(live):
    languages = httpx.get(live.url + "/v1/audio/voices", timeout=30).json()["languages"]
    assert "chinese" in languages and not any("dialect" in x for x in languages)
    r = httpx.post(
        live.url + "/v1/audio/speech",
        json={
            "model": "qwen3-tts-tiny",
            "voice": "dylan",
            "input": "x",
            "language": "beijing_dialect",
        },
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "language"
