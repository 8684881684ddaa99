"""The reference recording's decode and resampler (serve/reference_audio.py)."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import soundfile
import torch

from omniflow.serve.reference_audio import ReferenceAudioError, decode_reference, resample


def sine(rate: int, freq: float, seconds: float = 1.0, amp: float = 0.5) -> torch.Tensor:
    t = torch.arange(int(rate * seconds), dtype=torch.float64) / rate
    return (amp * torch.sin(2 * math.pi * freq * t)).to(torch.float32)


def peak_hz(x: torch.Tensor, rate: int) -> float:
    spectrum = torch.fft.rfft(x.double() * torch.hann_window(x.numel(), dtype=torch.float64))
    return float(torch.fft.rfftfreq(x.numel(), 1 / rate)[spectrum.abs().argmax()])


@pytest.mark.parametrize("src", [16000, 22050, 44100, 48000, 8000])
def test_a_sine_keeps_its_frequency_and_amplitude(src):
    y = resample(sine(src, 440.0), src, 24000)
    assert y.numel() == 24000  # one second stays one second
    inner = y[1200:-1200]  # away from the zero-padded ends
    assert peak_hz(inner, 24000) == pytest.approx(440.0, abs=1.0)
    assert float(inner.abs().max()) == pytest.approx(0.5, rel=0.005)
    # Sample for sample, the resampled sine is the sine sampled at 24 kHz.
    assert float((inner - sine(24000, 440.0)[1200:-1200]).abs().max()) < 2e-3


def test_downsampling_removes_what_the_new_rate_cannot_hold():
    """A 15 kHz tone is above 24 kHz's Nyquist (12 kHz): kept, it would alias to 9 kHz."""
    y = resample(sine(48000, 15000.0), 48000, 24000)
    assert float(y[1200:-1200].abs().max()) < 0.01


def test_the_same_rate_is_returned_as_is():
    x = sine(24000, 300.0)
    assert resample(x, 24000, 24000) is x


def wav_bytes(data: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, data, rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def test_stereo_is_mixed_to_mono_and_resampled():
    left = sine(16000, 440.0).numpy()
    stereo = np.stack([left, np.zeros_like(left)], axis=1)
    out = decode_reference(wav_bytes(stereo, 16000), 24000)
    assert out.shape == (24000,)
    assert float(out[1200:-1200].abs().max()) == pytest.approx(0.25, rel=0.01)


@pytest.mark.parametrize(
    ("raw", "kw", "says"),
    [
        (b"", {}, "is empty"),
        (b"RIFF....WAVEfmt nonsense", {}, "is not audio"),
        (wav_bytes(np.zeros(24000, np.float32), 24000), {}, "is silent"),
        (wav_bytes(sine(24000, 440.0, seconds=3).numpy(), 24000), {"max_seconds": 2}, "2 s"),
        (wav_bytes(sine(24000, 440.0).numpy(), 24000), {"max_bytes": 1000}, "limit is 1000"),
    ],
    ids=["empty", "not-audio", "silent", "too-long", "too-large"],
)
def test_refusals(raw, kw, says):
    with pytest.raises(ReferenceAudioError, match=says):
        decode_reference(raw, 24000, **kw)
