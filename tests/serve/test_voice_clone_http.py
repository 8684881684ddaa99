"""Voice clone over HTTP on the tiny Base model: `task_type: "Base"` with `ref_audio` (base64
or a data URI), `ref_text` or `x_vector_only_mode`, sent as the openai client sends extra
fields; and every bad reference a 400 naming the field."""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.core.speech import SpeechRequest
from omniflow.models.qwen3_tts.reference import EncodedReference
from omniflow.serve.run import ServerThread
from tests.serve.conftest import LiveServer
from tests.serve.fake_pipeline import INFO, FakePipeline
from tests.serve.helpers import audio_file, b64, openai_client

MODEL = "qwen3-tts-tiny-base"
N = 6
MAX_S = 3.0
MAX_BYTES = 400_000


@pytest.fixture(scope="module")
def base():
    with LiveServer(
        "model=qwen3_tts_tiny_base",
        f"server.max_ref_audio_s={MAX_S}",
        f"server.max_ref_audio_bytes={MAX_BYTES}",
    ) as server:
        yield server


def clone_pcm(server, **extra) -> bytes:
    client = openai_client(server.url)
    body = {"task_type": "Base", "seed": 3, "max_new_tokens": N, "ignore_eos": True, **extra}
    with client.audio.speech.with_streaming_response.create(
        model=MODEL,
        voice=None,  # type: ignore[arg-type]  # a voice clone names no voice
        input="Cloned.",
        response_format="pcm",
        extra_body=body,
    ) as response:
        return b"".join(response.iter_bytes())


def test_openai_client_streams_a_voice_clone(base):
    low = clone_pcm(base, ref_audio=b64(audio_file(freq=220.0)), ref_text="A low tone.")
    assert len(low) == N * 1920 * 2
    high = clone_pcm(base, ref_audio=b64(audio_file(freq=1500.0)), ref_text="A low tone.")
    assert high != low  # the reference reaches the prompt
    again = clone_pcm(base, ref_audio=b64(audio_file(freq=220.0)), ref_text="A low tone.")
    assert again == low


def test_x_vector_only_and_data_uri_and_another_rate(base):
    uri = "data:audio/flac;base64," + b64(audio_file(rate=16000, format="FLAC"))
    xvec = clone_pcm(base, ref_audio=uri, x_vector_only_mode=True)
    icl = clone_pcm(base, ref_audio=uri, ref_text="A low tone.")
    assert len(xvec) == len(icl) == N * 1920 * 2
    assert xvec != icl  # embedding only vs in context: different prompts


def post(server, **fields) -> httpx.Response:
    body = {"model": MODEL, "input": "Cloned.", "task_type": "Base", **fields}
    body = {k: v for k, v in body.items() if v is not None}
    return httpx.post(server.url + "/v1/audio/speech", json=body, timeout=60)


GOOD = b64(audio_file())
NOT_AUDIO = b64(b"this is a text file, not a recording " * 20)


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"ref_audio": "https://example.com/me.wav", "ref_text": "x"}, "ref_audio", "is a URL"),
        ({"ref_audio": "file:///etc/passwd", "ref_text": "x"}, "ref_audio", "is a URL"),
        ({"ref_audio": "not base64 at all!", "ref_text": "x"}, "ref_audio", "neither base64"),
        (
            {"ref_audio": "data:audio/wav,UklGRg==", "ref_text": "x"},
            "ref_audio",
            "is a data URI but",
        ),
        ({"ref_audio": NOT_AUDIO, "ref_text": "x"}, "ref_audio", "is not audio"),
        (
            {"ref_audio": b64(audio_file(seconds=MAX_S + 1, rate=8000)), "ref_text": "x"},
            "ref_audio",
            "limit is",
        ),
        (
            {"ref_audio": b64(audio_file(seconds=4.5, rate=48000)), "ref_text": "x"},
            "ref_audio",
            f"over {MAX_BYTES} bytes",
        ),
        ({"ref_audio": b64(audio_file(seconds=0)), "ref_text": "x"}, "ref_audio", "has no samples"),
        (
            {"ref_audio": b64(audio_file(seconds=0.1)), "ref_text": "x"},
            "ref_audio",
            "at least 0.5 s",
        ),
        ({"ref_audio": b64(audio_file(amp=0.0)), "ref_text": "x"}, "ref_audio", "is silent"),
        ({"ref_audio": ""}, "ref_audio", "needs ref_audio"),
        ({"ref_audio": None}, "ref_audio", "needs ref_audio"),
        ({"ref_audio": GOOD}, "ref_text", "needs ref_text"),
        ({"ref_audio": GOOD, "ref_text": " \u200b"}, "ref_text", "is empty"),
        (
            {"ref_audio": GOOD, "x_vector_only_mode": True, "ref_text": "x"},
            "ref_text",
            "not used with x_vector_only_mode",
        ),
        ({"ref_audio": GOOD, "ref_text": "x", "voice": "vivian"}, "voice", "names no voice"),
        (
            {"ref_audio": GOOD, "ref_text": "x", "x_vector_only_mode": "yes"},
            "x_vector_only_mode",
            "boolean",
        ),
        (
            {"ref_audio": None, "task_type": None, "voice": "vivian"},
            "voice",
            "has no preset speakers",
        ),
        (
            {"ref_audio": None, "task_type": "CustomVoice", "voice": "vivian"},
            "task_type",
            "it serves ['Base']",
        ),
    ],
)
def test_bad_references_are_400s_naming_the_field(base, fields, param, says):
    r = post(base, **fields)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert says in err["message"], err
    assert err["param"] == param
    base.wait_idle()
    assert base.pipeline.stats().in_flight == 0


# ------------------------------------------------------------------ off the event loop


class BlockingEncoder:
    """Encodes only once the test lets it: while it waits, the server must still answer."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def encode(self, audio):
        self.started.set()
        assert self.release.wait(30)
        return EncodedReference(ref_codes=(), speaker_embedding=(float(audio.numel()),))


class CloningFake(FakePipeline):
    def __init__(self, encoder: BlockingEncoder) -> None:
        super().__init__(dataclasses.replace(INFO, task_types=("Base",)))
        self.encoder = encoder
        self.seen: list[SpeechRequest] = []

    def reference_encoder(self):  # type: ignore[override]
        return self.encoder

    def submit(self, speech, sink, *limits):
        self.seen.append(speech)
        super().submit(dataclasses.replace(speech, voice="vivian"), sink, *limits)


def test_reference_encoding_runs_off_the_event_loop():
    encoder = BlockingEncoder()
    fake = CloningFake(encoder)
    body = {
        "model": INFO.model,
        "input": "x",
        "task_type": "Base",
        "ref_audio": b64(audio_file(rate=16000)),
        "x_vector_only_mode": True,
        "response_format": "pcm",
        "max_new_tokens": 2,
    }
    server_config = compose(["platform=cpu"]).server
    with ServerThread(fake, server_config) as server, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, server.url + "/v1/audio/speech", json=body, timeout=30)
        assert encoder.started.wait(30)
        # The encoder holds its thread; the loop still answers.
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        encoder.release.set()
        r = pending.result(timeout=30)
    assert r.status_code == 200 and len(r.content) == 2 * 1920 * 2
    (speech,) = fake.seen
    # Resampled to 24 kHz before encoding; x-vector only: no codes, no transcript.
    assert speech.speaker_embedding == (24000.0,)
    assert speech.ref_codes is None and speech.ref_text is None and speech.voice is None
