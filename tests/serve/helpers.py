"""Helpers the HTTP and WebSocket tests share: reference recordings, the openai client and a
fake pipeline with a counting reference encoder.

The `openai` package is a dev dependency only (the GPU image has none): nothing here imports
it at module level, so a test module that uses these helpers collects without it, and a test
that asks for the client (`openai_client`) is skipped there instead.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math
import threading
from typing import Any

import numpy as np
import pytest
import soundfile

from omniflow.models.qwen3_tts.reference import EncodedReference
from tests.serve.fake_pipeline import INFO, FakePipeline


def audio_file(
    rate: int = 24000, seconds: float = 1.0, freq: float = 220.0, amp: float = 0.5, **kw
) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    buf = io.BytesIO()
    data = (amp * np.sin(2 * math.pi * freq * t)).astype(np.float32)
    soundfile.write(buf, data, rate, format=kw.get("format", "WAV"))
    return buf.getvalue()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


LOW, HIGH = b64(audio_file(freq=220.0)), b64(audio_file(freq=1500.0, rate=16000))
"""Two reference recordings (base64 WAV) of different pitch and sample rate."""


def openai_client(url: str) -> Any:
    """The real `openai` client against the server at `url` (no retries); skips the calling
    test where the package is not installed."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


class CountingEncoder:
    """Counts encodings; holds each one until `release` is set (the test decides)."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def encode(self, audio):
        self.calls += 1
        self.started.set()
        assert self.release.wait(30)
        return EncodedReference(ref_codes=((7,) * 16,) * 2, speaker_embedding=(0.5,) * 4)


class CloningFake(FakePipeline):
    """A fake Base model: its reference encoder counts, and every request it is handed is
    kept (`seen`) before it is spoken with a preset voice."""

    def __init__(self) -> None:
        super().__init__(dataclasses.replace(INFO, task_types=("Base",)))
        self.encoder = CountingEncoder()
        self.seen = []

    def reference_encoder(self):  # type: ignore[override]
        return self.encoder

    def submit(self, speech, sink, *limits):
        self.seen.append(speech)
        super().submit(dataclasses.replace(speech, voice="vivian"), sink, *limits)
