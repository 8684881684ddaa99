"""PCM16 and WAV encoding of the float PCM the pipeline produces (24 kHz mono)."""

from __future__ import annotations

import struct
import wave
from pathlib import Path

import numpy as np


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
