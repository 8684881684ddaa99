"""The codec decoder's SnakeBeta activation, `x + sin(x e^alpha)^2 / (e^beta + 1e-9)` per
channel, as one Triton kernel.

In torch it is seven launches over the whole activation (exp, exp, mul, sin, pow, reciprocal,
mul-add), each reading and writing it: at 128 rows the decoder step's elementwise kernels were
~18 % of its GPU time on the H200 (docs/benchmarks.md, "128 rows for real"). Here the
activation is read once and written once; the per-channel `alpha`, `beta` are gathered per
element (they stay in cache).
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
    x_ptr,
    alpha_ptr,
    beta_ptr,
    out_ptr,
    n,
    n_channels,
    length,
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
):
    """Flat over the contiguous activation: a per-frame decoder step has rows of a few
    samples (length 4 at 1536 channels), so one program per row would leave most lanes idle;
    the channel of each element is recomputed from its index and its alpha/beta gathered
    (they stay in cache)."""
    if WIDE:  # 2**31 elements or more: 64-bit offsets (and slower 64-bit division)
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c = (offs // length) % n_channels
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    a = tl.exp(tl.load(alpha_ptr + c, mask=mask, other=0.0).to(tl.float32))
    inv = 1.0 / (tl.exp(tl.load(beta_ptr + c, mask=mask, other=0.0).to(tl.float32)) + 1e-9)
    xf = x.to(tl.float32)
    s = tl.sin(xf * a)
    tl.store(out_ptr + offs, (xf + inv * (s * s)).to(x.dtype), mask=mask)


BLOCK = 1024


def snake_beta(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """SnakeBeta of `x` [B, C, T] with per-channel `alpha`, `beta` [C] (log-scale, as in the
    checkpoint). A non-contiguous `x` is copied first. Returns a new contiguous tensor of x's
    dtype."""
    if x.dim() != 3 or alpha.shape != (x.shape[1],) or beta.shape != alpha.shape:
        raise ValueError(
            f"snake_beta: x {tuple(x.shape)} must be [B, C, T] with alpha {tuple(alpha.shape)} "
            f"and beta {tuple(beta.shape)} of shape [C]"
        )
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return out
    grid = (triton.cdiv(n, BLOCK),)
    wide = n >= 2**31
    _snake_beta_kernel[grid](x, alpha, beta, out, n, x.shape[1], x.shape[2], BLOCK=BLOCK, WIDE=wide)
    return out
