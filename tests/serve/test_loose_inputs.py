"""Inputs that were accepted and should not have been (issue 36 item 18): a body declared as
something other than JSON, and voice-clone references that are not a voice: an image in a
data URI, a constant (DC) signal, samples of 1e30, sample rates of a few hertz."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
import soundfile

from omniflow.config.compose import compose
from omniflow.serve.reference_audio import ReferenceAudioError, decode_reference, payload_bytes
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import INFO, FakePipeline
from tests.serve.helpers import CloningFake, audio_file, b64

BODY = json.dumps(
    {"model": "qwen3-tts-tiny", "voice": "vivian", "input": "Hi.", "max_new_tokens": 2}
).encode()


@pytest.fixture(scope="module")
def url():
    with ServerThread(FakePipeline(), compose(["platform=cpu"]).server) as server:
        yield server.url


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
def test_a_body_declared_as_anything_but_json_is_a_415(url, content_type):
    r = httpx.post(url + "/v1/audio/speech", content=BODY, headers={"content-type": content_type})
    assert r.status_code == 415, r.text
    assert r.json()["error"]["code"] == "415"


@pytest.mark.parametrize("encoding", ["gzip", "br", "Deflate"])
def test_a_compressed_body_is_a_415_naming_its_encoding(url, encoding):
    """Not decoded: gzip's bytes would read as "not valid UTF-8" (and an uncompressed body
    labelled gzip was taken as it came)."""
    import gzip

    headers = {"content-type": "application/json", "content-encoding": encoding}
    for body in (BODY, gzip.compress(BODY)):
        r = httpx.post(url + "/v1/audio/speech", content=body, headers=headers)
        assert r.status_code == 415, r.text
        assert (
            f"Content-Encoding '{encoding.lower()}' is not accepted" in r.json()["error"]["message"]
        )
    headers["content-encoding"] = "identity"
    assert httpx.post(url + "/v1/audio/speech", content=BODY, headers=headers).status_code == 200


@pytest.mark.parametrize(
    "content_type", [None, "application/json", "Application/JSON; charset=UTF-8"]
)
def test_json_or_no_content_type_is_read(url, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    r = httpx.post(url + "/v1/audio/speech", content=BODY, headers=headers)
    assert r.status_code == 200, r.text


def wav(data: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, data.astype(np.float32), rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


TONE = np.sin(2 * np.pi * 220 * np.arange(24000) / 24000) * 0.5


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (wav(np.full(24000, 0.3), 24000), "constant signal"),
        (wav(TONE * 1e30, 24000), "magnitude 5e\\+29"),
        (wav(TONE[:8], 8), "sample rate of 8 Hz"),
        (wav(TONE[:4], 1), "sample rate of 1 Hz"),
        (wav(np.tile(TONE, 10), 240_000), "sample rate of 240000 Hz"),
    ],
    ids=["dc", "1e30", "8-hz", "1-hz", "240-khz"],
)
def test_references_that_are_not_a_voice_are_refused(raw, says):
    with pytest.raises(ReferenceAudioError, match=says):
        decode_reference(raw, 24000)


def test_a_data_uri_of_another_media_type_is_refused():
    png = "data:image/png;base64," + b64(audio_file())
    with pytest.raises(ReferenceAudioError, match="'image/png', not audio"):
        payload_bytes(png, None)
    assert payload_bytes("data:audio/x-wav;base64," + b64(b"RIFF"), None) == b"RIFF"


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_line_wrapped_base64_is_the_same_audio(newline):
    """As the `base64` command writes it (76 columns) or a MIME body: the line breaks are
    not data (it was refused as "neither base64 nor a base64 data URI")."""
    data = b64(audio_file())
    wrapped = newline.join(data[i : i + 76] for i in range(0, len(data), 76)) + newline
    assert payload_bytes(wrapped, None) == payload_bytes(data, None) == audio_file()
    uri = "data:audio/wav;base64," + wrapped
    assert payload_bytes(uri, None) == audio_file()


def test_over_http_each_is_a_400_naming_ref_audio():
    fake = CloningFake()
    with ServerThread(fake, compose(["platform=cpu"]).server) as server:
        dc = b64(wav(np.full(24000, 0.3), 24000))
        for ref in ("data:image/png;base64," + b64(audio_file()), dc):
            body = {"model": INFO.model, "input": "Hi.", "ref_audio": ref, "ref_text": "A tone."}
            r = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=10)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "ref_audio"
    assert fake.encoder.calls == 0
