"""Log-mel features of the speaker encoder, with torch only.

The official speaker encoder reads a 128-bin log-mel spectrogram of 24 kHz audio: a
Hann-windowed STFT (n_fft 1,024, hop 256, window 1,024, no centring, the signal padded by
(n_fft - hop) / 2 on each side by reflection), magnitudes sqrt(re^2 + im^2 + 1e-9), a
Slaney-style mel filterbank (librosa's default: Slaney mel scale, area-normalised
triangles) and log(max(x, 1e-5)). The filterbank is computed here in float64 and rounded
to float32, as librosa returns it, so the features match without librosa.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

_F_SP = 200.0 / 3  # Slaney mel scale: linear below 1 kHz (15 mels per 1 kHz) ...
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOG_STEP = math.log(6.4) / 27.0  # ... and logarithmic above it


@dataclass(frozen=True)
class MelShape:
    """The speaker encoder's mel front end (the published values)."""

    sample_rate: int = 24000
    n_fft: int = 1024
    hop: int = 256
    window: int = 1024
    n_mels: int = 128
    fmin: float = 0.0
    fmax: float = 12000.0


def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    linear = hz / _F_SP
    log = _MIN_LOG_MEL + torch.log(hz.clamp(min=_MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOG_STEP
    return torch.where(hz >= _MIN_LOG_HZ, log, linear)


def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    linear = _F_SP * mel
    log = _MIN_LOG_HZ * torch.exp(_LOG_STEP * (mel - _MIN_LOG_MEL))
    return torch.where(mel >= _MIN_LOG_MEL, log, linear)


def mel_filterbank(shape: MelShape) -> torch.Tensor:
    """[n_mels, n_fft // 2 + 1] float32 triangles on the Slaney scale, each of unit area."""
    f64 = torch.float64
    fft_freqs = torch.linspace(0, shape.sample_rate / 2, shape.n_fft // 2 + 1, dtype=f64)
    edges = torch.tensor([shape.fmin, shape.fmax], dtype=f64)
    lo, hi = hz_to_mel(edges)
    mel_freqs = mel_to_hz(torch.linspace(float(lo), float(hi), shape.n_mels + 2, dtype=f64))
    widths = mel_freqs[1:] - mel_freqs[:-1]
    ramps = mel_freqs[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)
    weights *= (2.0 / (mel_freqs[2:] - mel_freqs[:-2]))[:, None]
    return weights.to(torch.float32)


class LogMel(torch.nn.Module):
    """audio [B, N] (24 kHz, float) -> log-mel [B, frames, n_mels]."""

    def __init__(self, shape: MelShape | None = None) -> None:
        super().__init__()
        shape = shape or MelShape()
        self.shape = shape
        self.register_buffer("filterbank", mel_filterbank(shape), persistent=False)
        self.register_buffer("hann", torch.hann_window(shape.window), persistent=False)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        s = self.shape
        pad = (s.n_fft - s.hop) // 2
        x = F.pad(audio.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
        spec = torch.stft(
            x,
            s.n_fft,
            hop_length=s.hop,
            win_length=s.window,
            window=self.hann.to(x.dtype),
            center=False,
            normalized=False,
            onesided=True,
            return_complex=True,
        )
        magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
        mel = torch.matmul(self.filterbank.to(x.dtype), magnitude)
        return torch.log(mel.clamp(min=1e-5)).transpose(1, 2)
