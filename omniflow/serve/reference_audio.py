"""A voice-clone reference recording, from the bytes a client sends to the samples the
encoders take: decoded, checked against the limits, mixed to mono and resampled.

Used by the server (`ref_audio`: base64 or a `data:audio/...;base64,` URI; a URL is refused:
the server fetches nothing) and by `synth ref_audio=FILE`. Everything here is CPU work that
the server runs on a worker thread, never on the event loop (routes.py). Every refusal is a
`ReferenceAudioError` (a ValueError) whose message says what is wrong with the recording.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re

import soundfile
import torch

from omniflow.serve.errors import quoted

SILENCE_PEAK = 1e-4
"""A reference whose loudest sample is below this (-80 dBFS) is silence: nothing to clone."""
MIN_SECONDS = 0.5
"""Shortest reference: a few codec frames (12.5 Hz) and enough samples for the speaker
encoder's mel frames; shorter carries too little voice to clone (and would not encode)."""
MIN_RATE, MAX_RATE = 8000, 192000
"""Sample rates a reference may have: telephone speech to studio audio. Below, there is no
voice to clone (and 1 Hz "audio" would be resampled 24,000-fold); above, the resampler's
kernel grows with the ratio for nothing a 24 kHz model can hear."""
MAX_PEAK = 4.0
"""Loudest sample accepted (+12 dBFS): integer formats decode within ±1 and a float file's
headroom stays well within this; 1e30 is not a recording."""
B64_PIECE = 1 << 20
"""Base64 characters decoded at once (a multiple of 4). The decoder holds the GIL for its
whole call, so a large reference decoded at once keeps the server's event loop from running
(the server decodes on a worker thread); in pieces, the loop gets a turn between them."""
BLOCK_TAPS = 1 << 21
"""Taps the resampler gathers at once (outputs per block times taps per output): its working
memory, whatever the ratio of the rates."""
_DATA_URI = re.compile(r"data:([^;,]*)((?:;[^;,]*)*),", re.ASCII)
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://")


class ReferenceAudioError(ValueError):
    """The reference recording cannot be used (the message says why)."""


def payload_bytes(value: str, max_bytes: int | None) -> bytes:
    """The audio file bytes of a `ref_audio` value: base64, or a base64 data URI."""
    if _URL.match(value):
        raise ReferenceAudioError(
            "is a URL, and the server fetches nothing; send the audio itself, base64-encoded "
            "or as a data URI (data:audio/wav;base64,...)"
        )
    data = value
    uri = _DATA_URI.match(value)
    if value.startswith("data:"):
        if uri is None or "base64" not in uri.group(2).split(";"):
            raise ReferenceAudioError("is a data URI but not data:audio/<type>;base64,<data>")
        media = uri.group(1).strip().lower()
        if not media.startswith("audio/"):
            raise ReferenceAudioError(
                f"is a data URI of {quoted(media or 'no type')}, not audio "
                "(data:audio/<type>;base64,<data>)"
            )
        data = value[uri.end() :]
    if any(ch in data for ch in "\n\r"):  # wrapped lines (`base64` without -w0, MIME's 76)
        data = "".join(data.split())
    if max_bytes is not None and len(data) * 3 // 4 > max_bytes + 2:
        raise ReferenceAudioError(f"is over {max_bytes} bytes (server.max_ref_audio_bytes)")
    try:
        pieces = (data[i : i + B64_PIECE] for i in range(0, len(data), B64_PIECE))
        return b"".join(base64.b64decode(piece, validate=True) for piece in pieces)
    except binascii.Error:
        raise ReferenceAudioError("is neither base64 nor a base64 data URI") from None


def decode_reference(
    raw: bytes, rate: int, max_bytes: int | None = None, max_seconds: float | None = None
) -> torch.Tensor:
    """Audio file bytes (WAV, FLAC, any format libsndfile reads) as mono float32 samples at
    `rate`. Refused: over `max_bytes`, not audio, empty, shorter than MIN_SECONDS, longer than
    `max_seconds`, silent.
    Another sample rate is resampled, not refused; channels are averaged."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise ReferenceAudioError(
            f"is {len(raw)} bytes; the limit is {max_bytes} (server.max_ref_audio_bytes)"
        )
    if not raw:
        raise ReferenceAudioError("is empty")
    try:
        info = soundfile.info(io.BytesIO(raw))
        if not MIN_RATE <= info.samplerate <= MAX_RATE:
            raise ReferenceAudioError(
                f"has a sample rate of {info.samplerate} Hz; a reference needs "
                f"{MIN_RATE} to {MAX_RATE} Hz"
            )
        if max_seconds is not None and info.duration > max_seconds:
            raise ReferenceAudioError(
                f"is {info.duration:.1f} s long; the limit is {max_seconds:g} s "
                "(server.max_ref_audio_s)"
            )
        data, src_rate = soundfile.read(io.BytesIO(raw), dtype="float32", always_2d=True)
    except soundfile.LibsndfileError as exc:
        raise ReferenceAudioError(f"is not audio that can be read ({exc.error_string})") from None
    if data.shape[0] == 0:
        raise ReferenceAudioError("has no samples")
    if data.shape[0] < MIN_SECONDS * src_rate:
        raise ReferenceAudioError(
            f"is {data.shape[0] / src_rate:.2f} s long; a reference needs at least "
            f"{MIN_SECONDS:g} s"
        )
    mono = torch.from_numpy(data).mean(dim=1)
    if not bool(mono.isfinite().all()):
        raise ReferenceAudioError("has samples that are not finite numbers")
    peak = float(mono.abs().max())
    if peak > MAX_PEAK:
        raise ReferenceAudioError(
            f"has samples of magnitude {peak:.3g}; audio is within ±1 (full scale), and a "
            f"reference within ±{MAX_PEAK:g}"
        )
    if peak < SILENCE_PEAK:
        raise ReferenceAudioError("is silent (peak below -80 dBFS): there is no voice to clone")
    if float((mono - mono.mean()).abs().max()) < SILENCE_PEAK:
        raise ReferenceAudioError("is a constant signal (DC): there is no voice to clone")
    return resample(mono, int(src_rate), rate)


def resample(x: torch.Tensor, src: int, dst: int, zeros: int = 16, rolloff: float = 0.95):
    """Band-limited resampling of mono `x` from `src` Hz to `dst` Hz (windowed sinc).

    Output sample j sits at input time t = j * src / dst; it is the sum of the input samples
    within `zeros` zero crossings of t, weighted by a sinc low-passed at `rolloff` of the
    lower Nyquist frequency (anti-aliasing when downsampling) and a Hann window. t's
    fractional part takes only `dst / gcd` values, so the kernel is a small table of phases
    and the sum is one gather per block of outputs. Length: ceil(len(x) * dst / src)."""
    if src == dst:
        return x
    g = math.gcd(src, dst)
    up, down = dst // g, src // g
    cutoff = min(1.0, dst / src) * rolloff
    half = math.ceil(zeros / cutoff)
    offsets = torch.arange(-half + 1, half + 1, dtype=torch.float64)
    phases = torch.arange(up, dtype=torch.float64) / up
    d = phases[:, None] - offsets[None, :]  # distance of each tap from t, in input samples
    window = torch.where(d.abs() < half, 0.5 * (1 + torch.cos(math.pi * d / half)), 0.0)
    kernel = (cutoff * torch.sinc(cutoff * d) * window).to(torch.float32)
    padded = torch.nn.functional.pad(x.to(torch.float32), (half, half))
    n_out = -(-x.numel() * up // down)
    taps = offsets.to(torch.long) + half
    out = torch.empty(n_out, dtype=torch.float32)
    block = max(256, BLOCK_TAPS // taps.numel())  # ~16 MiB of gather indices at a time
    for start in range(0, n_out, block):
        j = torch.arange(start, min(n_out, start + block))
        base = (j * down) // up
        phase = (j * down) % up
        out[start : start + j.numel()] = (padded[base[:, None] + taps] * kernel[phase]).sum(1)
    return out
