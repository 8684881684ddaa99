"""The voice registry over HTTP (`/v1/audio/voices` on a Base model): what GET lists, a
voice registered once and spoken with as `voice` (the same audio as cloning from the
recording each time), deletion, the `server.max_voices` bound, and every bad request a 4xx
in the OpenAI error shape. The tiny Base model serves the end-to-end tests; a fake pipeline
with a counting encoder shows that a voice is encoded once, off the event loop."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.serve.run import ServerThread
from tests.serve.conftest import LiveServer
from tests.serve.fake_pipeline import INFO
from tests.serve.helpers import HIGH, LOW, CloningFake, audio_file, b64, openai_client

MODEL = "qwen3-tts-tiny-base"
N = 4


@pytest.fixture(scope="module")
def base():
    with LiveServer("model=qwen3_tts_tiny_base", "server.max_voices=8") as server:
        yield server


def register(server, **fields) -> httpx.Response:
    body = {"name": "me", "ref_audio": LOW, "ref_text": "A low tone.", **fields}
    body = {k: v for k, v in body.items() if v is not None}
    return httpx.post(server.url + "/v1/audio/voices", json=body, timeout=60)


def speak(server, voice: str | None = None, **extra) -> bytes:
    """PCM of a short request through the openai client; `voice` alone is a plain OpenAI
    request (no task_type): on a Base model that is a voice clone."""
    client = openai_client(server.url)
    body = {"seed": 3, "max_new_tokens": N, "ignore_eos": True, **extra}
    with client.audio.speech.with_streaming_response.create(
        model=MODEL,
        voice=voice,  # type: ignore[arg-type]  # None: a clone from ref_audio
        input="Cloned.",
        response_format="pcm",
        extra_body=body,
    ) as response:
        return b"".join(response.iter_bytes())


def speech_error(server, **fields) -> dict:
    body = {"model": MODEL, "input": "Cloned.", **fields}
    r = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 400, r.text
    return r.json()["error"]


def listing(server) -> dict:
    r = httpx.get(server.url + "/v1/audio/voices", timeout=30)
    assert r.status_code == 200
    return r.json()


def test_a_base_model_lists_no_preset_speakers(base, live):
    """The tiny Base preset carries the default speaker table (dummy weights), but its
    prompts take no speaker id: GET lists only what `voice` can name, registered voices."""
    got = listing(base)
    assert set(got["voices"]) == {v["id"] for v in got["registered"]}
    assert not set(got["voices"]) & set(base.pipeline.info().voices)
    assert got["task_types"] == ["Base"] and got["max_voices"] == 8
    assert "english" in got["languages"]
    custom = listing(live)  # a CustomVoice model: its speakers, no registry
    assert "vivian" in custom["voices"] and "registered" not in custom
    assert custom["task_types"] == ["CustomVoice"]


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"voice": "vivian"}, "voice", "has no preset speakers"),
        ({"voice": "vivian", "task_type": "Base"}, "voice", "is not a registered voice"),
        ({"voice": "vivian", "task_type": "CustomVoice"}, "task_type", "it serves ['Base']"),
    ],
)
def test_a_preset_speaker_on_a_base_model_is_a_400(base, fields, param, says):
    err = speech_error(base, **fields)
    assert says in err["message"] and err["param"] == param


def test_a_registered_voice_speaks_as_its_reference_does(base):
    r = register(base, name="low voice")
    assert r.status_code == 201, r.text
    card = r.json()
    vid = card["id"]
    assert card["object"] == "audio.voice" and card["name"] == "low voice"
    assert not card["x_vector_only_mode"] and card["ref_frames"] == 13  # 1 s at 12.5 Hz
    assert vid in listing(base)["voices"]
    assert httpx.get(f"{base.url}/v1/audio/voices/{vid}").json() == card
    direct = speak(base, task_type="Base", ref_audio=LOW, ref_text="A low tone.")
    assert len(direct) == N * 1920 * 2
    assert speak(base, vid) == direct  # the cached codes, embedding and transcript
    assert speak(base, vid, task_type="Base") == direct
    other = register(base, ref_audio=HIGH).json()["id"]
    assert speak(base, other) != direct


def test_an_x_vector_voice_keeps_the_embedding_alone(base):
    r = register(base, ref_audio=HIGH, ref_text=None, x_vector_only_mode=True)
    assert r.status_code == 201, r.text
    assert r.json()["x_vector_only_mode"] and r.json()["ref_frames"] == 0
    direct = speak(base, task_type="Base", ref_audio=HIGH, x_vector_only_mode=True)
    assert speak(base, r.json()["id"]) == direct
    icl = speak(base, task_type="Base", ref_audio=HIGH, ref_text="A low tone.")
    assert direct != icl


def test_a_deleted_voice_is_gone(base):
    vid = register(base).json()["id"]
    r = httpx.delete(f"{base.url}/v1/audio/voices/{vid}")
    assert r.status_code == 200
    assert r.json() == {"id": vid, "object": "audio.voice.deleted", "deleted": True}
    assert vid not in listing(base)["voices"]
    for r in (
        httpx.delete(f"{base.url}/v1/audio/voices/{vid}"),
        httpx.get(f"{base.url}/v1/audio/voices/{vid}"),
    ):
        assert r.status_code == 404
        err = r.json()["error"]
        assert err["type"] == "not_found_error" and err["param"] == "voice_id"
    err = speech_error(base, voice=vid)
    assert err["param"] == "voice" and "not a registered voice" in err["message"]


NOT_AUDIO = b64(b"plain text, not a recording " * 30)


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"name": None}, "name", "Field required"),
        ({"name": ""}, "name", "at least 1 character"),
        ({"name": "a\x00b"}, "name", "control character"),
        ({"ref_audio": None}, "ref_audio", "Field required"),
        ({"ref_audio": ""}, "ref_audio", "is empty"),
        ({"ref_audio": "https://example.com/me.wav"}, "ref_audio", "is a URL"),
        ({"ref_audio": NOT_AUDIO}, "ref_audio", "is not audio"),
        ({"ref_audio": b64(audio_file(amp=0.0))}, "ref_audio", "is silent"),
        ({"ref_text": None}, "ref_text", "needs ref_text"),
        ({"ref_text": " \u200b"}, "ref_text", "is empty"),
        ({"x_vector_only_mode": True}, "ref_text", "not used with x_vector_only_mode"),
        ({"x_vector_only_mode": "yes"}, "x_vector_only_mode", "boolean"),
        ({"voice": "vivian"}, "voice", "Extra inputs"),
    ],
)
def test_a_bad_registration_is_a_400_naming_the_field(base, fields, param, says):
    before = listing(base)["voices"]
    r = register(base, **fields)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert says in err["message"] and err["param"] == param, err
    assert err["type"] == "invalid_request_error" and err["code"] == "400"
    assert listing(base)["voices"] == before


def test_a_registered_voice_takes_no_reference_fields_or_instructions(base):
    vid = register(base).json()["id"]
    for fields, param in (
        ({"ref_audio": LOW}, "voice"),
        ({"ref_text": "x"}, "ref_text"),
        ({"x_vector_only_mode": True}, "x_vector_only_mode"),
        ({"instructions": "Slowly."}, "instructions"),
    ):
        err = speech_error(base, voice=vid, task_type="Base", **fields)
        assert err["param"] == param, err


def test_a_custom_voice_model_registers_nothing(live):
    r = httpx.post(live.url + "/v1/audio/voices", json={"name": "x", "ref_audio": LOW})
    assert r.status_code == 400 and "does not support voice cloning" in r.text
    r = httpx.post(live.url + "/v1/audio/voices", content=b"{not json")
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]


# ------------------------------------------------------------- fake pipeline: encode once


def fake_server(fake: CloningFake, max_voices: int) -> ServerThread:
    return ServerThread(fake, compose(["platform=cpu", f"server.max_voices={max_voices}"]).server)


def test_a_voice_is_encoded_once_and_its_codes_reach_every_request():
    fake = CloningFake()
    with fake_server(fake, 4) as server:
        vid = register(server).json()["id"]
        body = {"model": INFO.model, "input": "x", "voice": vid, "max_new_tokens": 2}
        for _ in range(3):
            r = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=30)
            assert r.status_code == 200, r.text
    assert fake.encoder.calls == 1
    assert len(fake.seen) == 3
    for speech in fake.seen:
        assert speech.ref_codes == ((7,) * 16,) * 2 and speech.speaker_embedding == (0.5,) * 4
        assert speech.ref_text == "A low tone." and speech.voice is None


def test_registration_encodes_off_the_event_loop():
    fake = CloningFake()
    fake.encoder.release.clear()
    with fake_server(fake, 4) as server, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(register, server)
        assert fake.encoder.started.wait(30)
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        fake.encoder.release.set()
        assert pending.result(timeout=30).status_code == 201


@pytest.mark.parametrize("max_voices", [0, 2])
def test_a_full_registry_refuses_until_a_voice_is_deleted(max_voices):
    fake = CloningFake()
    with fake_server(fake, max_voices) as server:
        ids = [register(server).json()["id"] for _ in range(max_voices)]
        calls = fake.encoder.calls
        r = register(server)
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert f"server.max_voices = {max_voices}" in err["message"]
        assert err["type"] == "invalid_request_error"
        assert fake.encoder.calls == calls  # refused before encoding
        assert listing(server)["voices"] == ids and listing(server)["max_voices"] == max_voices
        if ids:
            assert httpx.delete(f"{server.url}/v1/audio/voices/{ids[0]}").status_code == 200
            assert register(server).status_code == 201


def test_docs_show_the_registration_schema(base):
    spec = httpx.get(base.url + "/openapi.json").json()
    body = spec["paths"]["/v1/audio/voices"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert set(schema["required"]) == {"name", "ref_audio"}
    assert "x_vector_only_mode" in schema["properties"] and schema["additionalProperties"] is False
    assert "delete" in spec["paths"]["/v1/audio/voices/{voice_id}"]


def test_a_registration_holds_its_place_while_it_encodes():
    """Capacity 1: while the first reference encodes, a second registration is refused at
    once without encoding; a refused reference frees its place."""
    fake = CloningFake()
    fake.encoder.release.clear()
    with fake_server(fake, 1) as server, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(register, server)
        assert fake.encoder.started.wait(30)
        assert register(server).status_code == 409
        assert fake.encoder.calls == 1
        fake.encoder.release.set()
        vid = pending.result(timeout=30).json()["id"]
        assert httpx.delete(f"{server.url}/v1/audio/voices/{vid}").status_code == 200
        assert register(server, ref_audio=NOT_AUDIO).status_code == 400
        assert register(server).status_code == 201  # the failed one left no place taken
