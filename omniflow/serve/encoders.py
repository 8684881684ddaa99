"""Bytes out of the float PCM the pipeline produces (24 kHz mono): PCM16, WAV headers, SSE
events, whole-file flac/opus through libsndfile, and mp3, whole or streamed, through LAME.

A streamed mp3 body is the raw PCM16 stream re-encoded as it flows (`mp3_stream`): LAME
(the `lameenc` package) is a streaming encoder, so each chunk of PCM becomes MPEG frames
as soon as a frame's worth of samples (576 at 24 kHz) is there, and `flush` emits the rest.
A whole mp3 is the same encoder's output for the whole PCM (`mp3_whole`), byte for byte what
the stream sends, so the two decode to the same length. That length is the audio plus LAME's
encoder delay and end padding, in whole 576-sample frames (for 0.88 s of audio, 0.936 s): a
stream cannot carry the gapless tag (its first frame, written once the length is known) that
lets a decoder trim them, so the whole file carries none either. libsndfile's mp3 writer is
not used: it needs a seekable file to finish, and it writes that tag.

Kept apart from the response logic so that `synth` and tests can write audio exactly as the
server sends it.
"""

from __future__ import annotations

import io
import json
import struct
import wave
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import lameenc
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
    """A whole response body: raw PCM16, WAV, LAME's mp3, or a libsndfile container (flac,
    opus)."""
    data = pcm16(audio)
    if fmt == "pcm":
        return data
    if fmt == "wav":
        return wav_header(sample_rate, len(data)) + data
    if fmt == "mp3":
        return mp3_whole(data, sample_rate)
    container, subtype = ENCODED[fmt]
    buf = io.BytesIO()
    soundfile.write(buf, audio, sample_rate, format=container, subtype=subtype)
    return buf.getvalue()


MP3_KBPS = 64
"""Constant bit rate of streamed mp3: speech at 24 kHz mono is clear at 64 kb/s, and a
constant rate keeps every frame the same size for players that start mid-stream."""


def mp3_encoder(sample_rate: int) -> lameenc.Encoder:
    """A LAME encoder for mono PCM16 at `sample_rate` (quality 2: LAME's "high")."""
    enc = lameenc.Encoder()
    enc.set_channels(1)
    enc.set_in_sample_rate(sample_rate)
    enc.set_bit_rate(MP3_KBPS)
    enc.set_quality(2)
    return enc


def mp3_whole(pcm: bytes, sample_rate: int) -> bytes:
    """PCM16 -> the mp3 bytes `mp3_stream` sends for the same audio."""
    enc = mp3_encoder(sample_rate)
    return bytes(enc.encode(pcm)) + bytes(enc.flush())


async def mp3_stream(
    pcm_chunks: AsyncGenerator[bytes, None], sample_rate: int
) -> AsyncIterator[bytes]:
    """PCM16 chunks in, mp3 bytes out as they are encoded, then the encoder's tail. Closing
    this stream closes `pcm_chunks` at once (which ends the request there)."""
    enc = mp3_encoder(sample_rate)
    try:
        async for chunk in pcm_chunks:
            data = bytes(enc.encode(chunk))
            if data:
                yield data
        yield bytes(enc.flush())
    finally:
        await pcm_chunks.aclose()


def sse_event(data: dict[str, Any]) -> bytes:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(data)}\n\n".encode()
