"""The codec decoder's SnakeBeta activation, `x + sin(x e^alpha)^2 / (e^beta + 1e-9)` per
channel, as one Triton kernel.

In torch it is seven launches over the whole activation (exp, exp, mul, sin, pow, reciprocal,
mul-add), each reading and writing it, so at large batches those memory-bound passes are a
large share of the decoder step (measured: see docs/performance.md). Here the activation is
read once and written once; the per-channel `alpha`, `beta` are gathered per element (they
stay in cache).
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
    bias_ptr,
    hist_ptr,
    out_ptr,
    n,
    n_channels,
    length,
    hist_len,
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_HIST: tl.constexpr,
):
    """Flat over the contiguous output: a per-frame decoder step has rows of a few
    samples (length 4 at 1536 channels), so one program per row would leave most lanes idle;
    the row and channel of each element are recomputed from its index and alpha/beta/bias
    gathered (they stay in cache). With HAS_HIST an output row is the row's `hist_len`
    history samples, copied, then its `length` activated ones."""
    if WIDE:  # 2**31 elements or more: 64-bit offsets (and slower 64-bit division)
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if HAS_HIST:
        width = length + hist_len
        row = offs // width
        t = offs - row * width
        past = t < hist_len
        h = tl.load(hist_ptr + row * hist_len + t, mask=mask & past, other=0.0)
        x = tl.load(x_ptr + row * length + (t - hist_len), mask=mask & (t >= hist_len), other=0.0)
    else:
        row = offs // length
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    c = row % n_channels
    a = tl.exp(tl.load(alpha_ptr + c, mask=mask, other=0.0).to(tl.float32))
    inv = 1.0 / (tl.exp(tl.load(beta_ptr + c, mask=mask, other=0.0).to(tl.float32)) + 1e-9)
    xf = x.to(tl.float32)
    if HAS_BIAS:
        xf = xf + tl.load(bias_ptr + c, mask=mask, other=0.0).to(tl.float32)
    s = tl.sin(xf * a)
    y = xf + inv * (s * s)
    if HAS_HIST:
        y = tl.where(past, h.to(tl.float32), y)
    tl.store(out_ptr + offs, y.to(x.dtype), mask=mask)


BLOCK = 1024


def snake_beta(
    x: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    bias: torch.Tensor | None = None,
    history: torch.Tensor | None = None,
) -> torch.Tensor:
    """SnakeBeta of `x` [B, C, T] with per-channel `alpha`, `beta` [C] (log-scale, as in the
    checkpoint). A non-contiguous `x` is copied first. Returns a new contiguous tensor of x's
    dtype.

    Two epilogues of the streaming decoder fold in here, each saving a full pass over the
    activation: `bias` [C] is the preceding convolution's bias, added before the activation
    (the convolution then runs without it, and torch's separate broadcast add, the slowest
    elementwise kernel of a 128-row window pass, goes); `history` [B, C, H] is the next causal
    convolution's carried input, written in front: the result is [B, C, H + T], what
    `torch.cat([history, snake(x)], -1)` gives, without the copy."""
    if x.dim() != 3 or alpha.shape != (x.shape[1],) or beta.shape != alpha.shape:
        raise ValueError(
            f"snake_beta: x {tuple(x.shape)} must be [B, C, T] with alpha {tuple(alpha.shape)} "
            f"and beta {tuple(beta.shape)} of shape [C]"
        )
    if bias is not None and bias.shape != alpha.shape:
        raise ValueError(f"snake_beta: bias {tuple(bias.shape)} must be [C] = {tuple(alpha.shape)}")
    b, c, t = x.shape
    hist_len = 0
    if history is not None:
        if history.dim() != 3 or history.shape[:2] != (b, c) or history.dtype != x.dtype:
            raise ValueError(
                f"snake_beta: history {tuple(history.shape)} {history.dtype} must be "
                f"[{b}, {c}, H] {x.dtype}"
            )
        history = history.contiguous()
        hist_len = history.shape[2]
    x = x.contiguous()
    # read at their channel index
    alpha, beta = alpha.contiguous(), beta.contiguous()
    bias = None if bias is None else bias.contiguous()
    out = torch.empty((b, c, hist_len + t), device=x.device, dtype=x.dtype)
    n = out.numel()
    if n == 0:
        return out
    grid = (triton.cdiv(n, BLOCK),)
    _snake_beta_kernel[grid](
        x,
        alpha,
        beta,
        alpha if bias is None else bias,  # not read without HAS_BIAS
        x if history is None else history,  # not read without HAS_HIST
        out,
        n,
        c,
        t,
        hist_len,
        BLOCK=BLOCK,
        WIDE=n >= 2**31,
        HAS_BIAS=bias is not None,
        HAS_HIST=hist_len > 0,
    )
    return out
