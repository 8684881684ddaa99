"""`speed`: the stretcher itself (length, pitch, chunk joins, passthrough at 1.0), then the
HTTP route (every format, whole and streamed) and the WebSocket session."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile
from websockets.sync.client import connect

from omniflow.core.events import AudioEvent
from omniflow.serve.speed import TimeStretch, stretch, stretch_event
from omniflow.serve.ws import PATH
from tests.serve.conftest import LiveServer

SR = 24000
FRAMES = 6
"""With ignore_eos the tiny model makes exactly this many 80 ms frames: 11,520 samples."""
SAMPLES = FRAMES * 1920


def voice(seconds: float = 1.0, f0: float = 150.0) -> np.ndarray:
    """A vowel-like tone: harmonics of `f0`, its loudness rising and falling."""
    t = np.arange(round(seconds * SR)) / SR
    tone = sum(np.sin(2 * np.pi * k * f0 * t) / k for k in range(1, 12))
    return (0.3 * tone * np.sin(np.pi * t / seconds) ** 0.5).astype(np.float32)


def pitch(x: np.ndarray) -> float:
    """The fundamental, by autocorrelation over the loud middle."""
    mid = x[len(x) // 4 : 3 * len(x) // 4]
    ac = np.correlate(mid, mid, "full")[mid.size - 1 :]
    lo, hi = SR // 400, SR // 60
    return SR / (lo + int(np.argmax(ac[lo:hi])))


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 2.0, 4.0])
def test_length_is_exact_and_pitch_is_kept(speed):
    x = voice()
    y = stretch(x, speed, SR)
    assert y.dtype == np.float32 and y.size == round(x.size / speed)
    assert abs(pitch(y) / pitch(x) - 1) < 0.03  # a resampler would move it by `speed`
    assert np.abs(y).max() > 0.5 * np.abs(x).max()  # audio, not silence


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_chunks_fed_one_by_one_give_the_whole_stretch(speed):
    """State carries across chunks: any split gives the audio of one whole stretch, so the
    joins carry no step (a per-chunk stretch would start each chunk afresh)."""
    x = voice(2.0)
    whole = stretch(x, speed, SR)
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, x.size), 30, replace=False))
    stretcher = TimeStretch(speed, SR)
    parts = [stretcher.push(c) for c in np.split(x, cuts)] + [stretcher.finish()]
    joined = np.concatenate(parts)
    assert np.array_equal(joined, whole)
    joins = np.cumsum([p.size for p in parts])[:-1]
    joins = joins[(joins > 0) & (joins < joined.size)]
    steps = np.abs(np.diff(joined))
    assert steps[joins - 1].max() <= steps.max()  # no join is the largest step by far
    assert steps[joins - 1].max() < 0.2  # a click would jump by most of the range


def test_speed_one_passes_the_audio_untouched():
    x = voice(0.5)
    assert TimeStretch.of(1.0, SR) is None
    assert stretch(x, 1.0, SR) is x
    ev = AudioEvent("r", pcm=x, finished=True)
    assert stretch_event(None, ev) is ev


def test_events_carry_the_tail_and_no_empty_audio():
    stretcher = TimeStretch(2.0, SR)
    first = stretch_event(stretcher, AudioEvent("r", pcm=np.zeros(100, np.float32)))
    assert first.pcm is None  # nothing ready yet: no empty chunk to send
    last = stretch_event(stretcher, AudioEvent("r", pcm=np.zeros(1000, np.float32), finished=True))
    assert last.finished and last.pcm is not None and last.pcm.size == 550


def test_out_of_range_is_refused():
    for speed in (0.2, 4.5):
        with pytest.raises(ValueError, match="speed must be in"):
            TimeStretch(speed, SR)


# ------------------------------------------------------------------- over HTTP and WS


@pytest.fixture(scope="module")
def live():
    with LiveServer() as server:
        yield server


def speech(live, **fields) -> httpx.Response:
    body = {"model": "qwen3-tts-tiny", "input": "Hello there.", "voice": "vivian", "seed": 3}
    body |= {"max_new_tokens": FRAMES, "ignore_eos": True, **fields}
    r = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, "<i2").astype(np.float32) / 32767.0


def test_whole_and_streamed_responses_in_every_format_have_the_stretched_length(live):
    plain = samples(speech(live, response_format="pcm").content)
    assert plain.size == SAMPLES
    want = round(SAMPLES / 2.0)
    whole = speech(live, response_format="pcm", speed=2.0).content
    streamed = speech(live, response_format="pcm", speed=2.0, stream=True).content
    assert len(whole) == 2 * want
    assert streamed == whole  # the streamed chunks join into the whole response
    # the stretch of the plain audio in one piece (from its PCM16: near, not equal)
    assert np.abs(samples(whole) - stretch(plain, 2.0, SR)).max() < 0.02
    want = round(SAMPLES / 1.5)
    for fmt in ("flac", "opus"):
        audio, rate = soundfile.read(
            io.BytesIO(speech(live, response_format=fmt, speed=1.5).content)
        )
        assert rate == SR and abs(audio.size / want - 1) < 0.02, fmt
    wav = speech(live, response_format="wav", speed=1.5, stream=True).content
    assert len(wav) - 44 == 2 * want
    events = speech(live, response_format="pcm", speed=1.5, stream_format="sse").text
    deltas = [json.loads(x[6:]) for x in events.split("\n\n") if x.startswith("data: ")]
    audio = b"".join(base64.b64decode(d["audio"]) for d in deltas if "audio" in d)
    assert len(audio) == 2 * want and deltas[-1]["usage"]["audio_seconds"] == want / SR
    for stream in (False, True):  # mp3: the audio plus LAME's delay and padding
        mp3, _ = soundfile.read(
            io.BytesIO(speech(live, response_format="mp3", speed=1.5, stream=stream).content)
        )
        assert want <= mp3.size <= want + 3 * 576


@pytest.mark.parametrize("speed", [0.1, 4.01, 9.0])
def test_out_of_range_speed_is_a_400_naming_it(live, speed):
    body = {"model": "qwen3-tts-tiny", "input": "Hello.", "speed": speed}
    r = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "speed" and "speed" in err["message"]


def test_a_websocket_session_speaks_at_its_speed(live):
    def sentence_bytes(**config) -> int:
        with connect(f"ws://127.0.0.1:{live.port}{PATH}") as ws:
            ws.send(
                json.dumps(
                    {
                        "type": "session.config",
                        "response_format": "pcm",
                        "seed": 3,
                        "max_new_tokens": FRAMES,
                        "ignore_eos": True,
                        **config,
                    }
                )
            )
            ws.send(json.dumps({"type": "input.text", "text": "Hello there."}))
            ws.send(json.dumps({"type": "input.done"}))
            total = 0
            while True:
                message = ws.recv(timeout=60)
                if isinstance(message, bytes):
                    total += len(message)
                elif json.loads(message)["type"] == "session.done":
                    return total

    assert sentence_bytes() == 2 * SAMPLES
    assert sentence_bytes(speed=2.0) == 2 * round(SAMPLES / 2.0)
    assert sentence_bytes(speed=0.5, stream_audio=True) == 2 * round(SAMPLES / 0.5)
