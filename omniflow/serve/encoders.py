"""Bytes out of the float PCM the pipeline produces (24 kHz mono): PCM16, WAV headers, SSE
events, and whole-file flac/mp3/opus through libsndfile.

Kept apart from the response logic so that `synth` and tests can write audio exactly as the
server sends it.
"""

from __future__ import annotations

import io
import json
import struct
import wave
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from omniflow.serve.protocol import ENCODED


def pcm16(samples: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> little-endian signed 16-bit bytes (clipped, rounded)."""
    clipped = np.clip(samples.astype(np.float32), -1.0, 1.0)
    return np.round(clipped * 32767.0).astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """RIFF/WAVE header for mono s16le. `data_bytes=None` (streaming, length unknown)
    writes the maximal sizes players treat as "until the stream ends"."""
    data = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data)
    )


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm16(samples))


def encode_whole(audio: np.ndarray, fmt: str, sample_rate: int) -> bytes:
    """A whole response body: raw PCM16, WAV, or a libsndfile container (flac, mp3, opus)."""
    data = pcm16(audio)
    if fmt == "pcm":
        return data
    if fmt == "wav":
        return wav_header(sample_rate, len(data)) + data
    container, subtype = ENCODED[fmt]
    buf = io.BytesIO()
    soundfile.write(buf, audio, sample_rate, format=container, subtype=subtype)
    return buf.getvalue()


def sse_event(data: dict[str, Any]) -> bytes:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(data)}\n\n".encode()
