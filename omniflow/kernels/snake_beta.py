"""The codec decoder's SnakeBeta activation, `x + sin(x e^alpha)^2 / (e^beta + 1e-9)` per
channel, as one Triton kernel.

In torch it is seven launches over the whole activation (exp, exp, mul, sin, pow, reciprocal,
mul-add), each reading and writing it: at 128 rows the decoder step's elementwise kernels were
~18 % of its GPU time on the H200 (docs/benchmarks.md, "128 rows for real"). Here the
activation is read once and written once; the per-channel `alpha`, `beta` are read per row.
Computed in float32 in torch's order (an fp32 decoder matches within sin's last bits; a bf16
one rounds once, at the store, where torch rounds after each op). Graph-safe: shapes alone fix
the launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _snake_beta_kernel(
    x_ptr, alpha_ptr, beta_ptr, out_ptr, n_channels, length, stride_b, stride_c, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    b = row // n_channels
    c = row % n_channels
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < length
    x = tl.load(x_ptr + b * stride_b + c * stride_c + cols, mask=mask, other=0.0)
    a = tl.exp(tl.load(alpha_ptr + c).to(tl.float32))
    inv = 1.0 / (tl.exp(tl.load(beta_ptr + c).to(tl.float32)) + 1e-9)
    xf = x.to(tl.float32)
    s = tl.sin(xf * a)
    tl.store(out_ptr + row * length + cols, (xf + inv * (s * s)).to(x.dtype), mask=mask)


BLOCK = 512


def snake_beta(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """SnakeBeta of `x` [B, C, T] with per-channel `alpha`, `beta` [C] (log-scale, as in the
    checkpoint); `x` may be a view whose last axis has unit stride. Returns a new contiguous
    tensor of x's dtype."""
    if x.dim() != 3 or alpha.shape != (x.shape[1],) or beta.shape != alpha.shape:
        raise ValueError(
            f"snake_beta: x {tuple(x.shape)} must be [B, C, T] with alpha {tuple(alpha.shape)} "
            f"and beta {tuple(beta.shape)} of shape [C]"
        )
    if x.stride(-1) != 1:
        x = x.contiguous()
    bsz, channels, length = x.shape
    out = torch.empty((bsz, channels, length), device=x.device, dtype=x.dtype)
    if out.numel() == 0:
        return out
    grid = (bsz * channels, triton.cdiv(length, BLOCK))
    _snake_beta_kernel[grid](
        x, alpha, beta, out, channels, length, x.stride(0), x.stride(1), BLOCK=BLOCK
    )
    return out
