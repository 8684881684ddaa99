"""The codec decoder's stated precision bound (`model.codec_dtype`) against its float32 PCM.

One place for the numbers the CPU and CUDA tests enforce and docs/performance.md states
(measured figures and their margin there): a reduced-precision decoder's PCM of the same codes
stays within `BOUNDS[weights][dtype]` of the float32 decoder's, per sample (max abs) and as a
whole (SNR). Two weight sets, two bounds: the official-reference fixture's weights (every
tensor drawn at a trained model's scale) and the dummy weights (zero biases, larger
activations: the worst case measured). The inputs are fixed, so a lost bias or carried history
shows as a breach.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class Bound(NamedTuple):
    snr_db: float
    """Lowest signal-to-error ratio of the whole clip: 10 log10(sum want^2 / sum err^2)."""
    max_abs: float
    """Largest per-sample error (PCM in [-1, 1])."""


BOUNDS: dict[str, dict[torch.dtype, Bound]] = {
    "fixture": {
        torch.bfloat16: Bound(snr_db=40.0, max_abs=0.03),
        torch.float16: Bound(snr_db=55.0, max_abs=0.004),
    },
    "dummy": {
        torch.bfloat16: Bound(snr_db=30.0, max_abs=0.05),
        torch.float16: Bound(snr_db=48.0, max_abs=0.008),
    },
}
DTYPES = (torch.bfloat16, torch.float16)


class PcmError(NamedTuple):
    max_abs: float
    snr_db: float


def pcm_error(want: torch.Tensor, got: torch.Tensor) -> PcmError:
    """Max abs error and SNR (dB) of `got` against `want` (any dtypes and devices; float64 sums)."""
    if want.shape != got.shape:
        raise ValueError(f"PCM shapes differ: {tuple(want.shape)} vs {tuple(got.shape)}")
    w = want.detach().double().cpu()
    e = got.detach().double().cpu() - w
    noise = float(e.pow(2).sum())
    snr = math.inf if noise == 0 else 10 * math.log10(float(w.pow(2).sum()) / noise)
    return PcmError(float(e.abs().max()), snr)


def assert_within_bound(
    want: torch.Tensor, got: torch.Tensor, dtype: torch.dtype, weights: str = "dummy"
) -> PcmError:
    """`got` (a `dtype` decoder's PCM) within `BOUNDS[weights][dtype]` of `want` (float32's);
    returns the error for further checks (a decoder that silently ran float32 has none)."""
    bound = BOUNDS[weights][dtype]
    err = pcm_error(want, got)
    assert not bool(torch.isnan(got).any()), f"{dtype}: NaN in the PCM"
    assert err.snr_db >= bound.snr_db, f"{dtype}: SNR {err.snr_db:.2f} dB < {bound.snr_db} dB"
    assert err.max_abs <= bound.max_abs, f"{dtype}: max abs {err.max_abs:.4g} > {bound.max_abs}"
    return err
