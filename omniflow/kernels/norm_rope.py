"""RMSNorm, residual add + RMSNorm, and RMSNorm followed by rotary embedding, each as one
Triton launch.

Why: in the eager torch form an RMSNorm is eight kernels (cast, square, mean, add, rsqrt,
multiply, cast back, weight) and a rotary embedding five more (two products, a negation, a
concatenation, a sum). A 1.7B frame runs about 430 norms (28 talker layers, 15 code-predictor
steps of 5 layers) and 320 q/k rotaries: thousands of tiny kernels, the largest share of a
captured frame's GPU time (measured: see docs/performance.md). Here each is one launch.

Semantics are those of `omniflow.models.layers.norm.RMSNorm` and
`omniflow.models.layers.rotary.apply_rotary`, rounding included: the statistics in fp32, the
normalised row rounded to the activation dtype before the weight multiplies it, the product
rounded to the result dtype (torch's type promotion of weight and activation); the rotary's
two products and their sum each rounded to the activation dtype, as bf16 torch ops round.
Only the mean's summation order and the reciprocal square root's last bit can differ from
torch, so results agree to an ulp, not bitwise; the torch modules themselves are the oracle
the tests compare with.

Both kernels launch from shapes alone (no host read), so a CUDA graph can record them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    d_ptr,
    w_ptr,
    sum_ptr,
    out_ptr,
    stride_x,
    stride_d,
    stride_sum,
    stride_out,
    n_cols,
    eps,
    BLOCK: tl.constexpr,
    ADD: tl.constexpr,
):
    """One row's RMSNorm; with ADD, of x + d (the sum stored too, rounded as torch's add)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if ADD:
        d = tl.load(d_ptr + row * stride_d + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * stride_sum + cols, x, mask=mask)
    h = x.to(tl.float32)
    var = tl.sum(h * h, axis=0) / n_cols
    normed = (h * tl.math.rsqrt(var + eps)).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (w * normed).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, y, mask=mask)


@triton.jit
def norm_rope_row(base, w_ptr, cos_row, sin_row, eps, HEAD_DIM: tl.constexpr):
    """One head's RMSNorm then rotary, for the head at `base` (unit stride), as fp32 values
    rounded as the torch layers round (the caller stores them in the activation dtype).
    `cos_row`/`sin_row` point at the position's table rows. Shared with the fused
    attention kernels (`frame_attention`)."""
    half: tl.constexpr = HEAD_DIM // 2
    cols = tl.arange(0, HEAD_DIM)
    partner = (cols + half) % HEAD_DIM
    x = tl.load(base + cols)
    h = x.to(tl.float32)
    var = tl.sum(h * h, axis=0) / HEAD_DIM
    inv = tl.math.rsqrt(var + eps)
    w = tl.load(w_ptr + cols).to(tl.float32)
    w_partner = tl.load(w_ptr + partner).to(tl.float32)
    # The normalised row and its rotate-half partner, each rounded as the norm rounds.
    y = (w * (h * inv).to(x.dtype).to(tl.float32)).to(x.dtype)
    hp = tl.load(base + partner).to(tl.float32)
    yp = (w_partner * (hp * inv).to(x.dtype).to(tl.float32)).to(x.dtype)
    rotated = tl.where(cols < half, -yp.to(tl.float32), yp.to(tl.float32))
    c = tl.load(cos_row + cols).to(tl.float32)
    s = tl.load(sin_row + cols).to(tl.float32)
    a = (y.to(tl.float32) * c).to(x.dtype).to(tl.float32)
    b = (rotated * s).to(x.dtype).to(tl.float32)
    return (a + b).to(x.dtype)


@triton.jit
def _rms_norm_rope_kernel(
    x_ptr,
    w_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    heads,
    table_rows,
    stride_xt,
    stride_xh,
    stride_ot,
    stride_oh,
    stride_ct,
    stride_st,
    eps,
    HEAD_DIM: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    token = pid // heads
    head = pid % heads
    cols = tl.arange(0, HEAD_DIM)
    trow = token % table_rows
    y = norm_rope_row(
        x_ptr + token * stride_xt + head * stride_xh,
        w_ptr,
        cos_ptr + trow * stride_ct,
        sin_ptr + trow * stride_st,
        eps,
        HEAD_DIM,
    )
    tl.store(out_ptr + token * stride_ot + head * stride_oh + cols, y)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, cols] with unit column stride (a view when possible)."""
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`RMSNorm(weight, eps)(x)` for x [..., D] on CUDA, in one launch."""
    rows = _rows(x)
    dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty(rows.shape, device=x.device, dtype=dtype)
    # No add: the delta and sum arguments are never read (x stands in for them).
    _launch_rms_norm(rows, None, weight, rows, out, eps)
    return out.view(*x.shape[:-1], rows.shape[1])


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm(weight, eps)(x + delta)) for [..., D] on CUDA in one launch: a
    decoder layer's residual add and the norm that reads it (two launches and a round trip
    of the residual through memory saved per add)."""
    if x.shape != delta.shape or x.dtype != delta.dtype:
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)} and delta {tuple(delta.shape)} differ")
    xr, dr = _rows(x), _rows(delta)
    total = torch.empty(xr.shape, device=x.device, dtype=x.dtype)
    out = torch.empty(xr.shape, device=x.device, dtype=torch.promote_types(weight.dtype, x.dtype))
    _launch_rms_norm(xr, dr, weight, total, out, eps)
    return total.view(x.shape), out.view(*x.shape[:-1], xr.shape[1])


def _launch_rms_norm(
    rows: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    total: torch.Tensor,
    out: torch.Tensor,
    eps: float,
) -> None:
    """One `_rms_norm_kernel` launch over rows [N, D], a program per row; with `delta`, the
    residual add first (its sum stored in `total`), else `total` is never written."""
    n = rows.shape[1]
    _rms_norm_kernel[(rows.shape[0],)](
        rows,
        rows if delta is None else delta,
        weight,
        total,
        out,
        rows.stride(0),
        0 if delta is None else delta.stride(0),
        0 if delta is None else total.stride(0),
        out.stride(0),
        n,
        eps,
        BLOCK=triton.next_power_of_2(n),
        ADD=delta is not None,
    )


def rms_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
) -> torch.Tensor:
    """`apply_rotary(RMSNorm(weight, eps)(x), cos, sin)` for x [..., H, D] (per-head norm,
    as Qwen3's q/k norms) in one launch. cos/sin [..., D] in x's dtype; their leading shape
    is a suffix of x's (the code predictor's [L, D] tables broadcast over its batch).

    The weight must have x's dtype (the model's own parameters do): the rotary then
    receives the activation dtype, as in torch."""
    *lead, heads, d = x.shape
    if weight.dtype != x.dtype or cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise ValueError("rms_norm_rope: weight, cos and sin must have the activation's dtype")
    if d % 2 or d & (d - 1):
        raise ValueError(f"rms_norm_rope: head_dim {d} must be a power of two")
    tokens = 1
    for n in lead:
        tokens *= n
    table_lead = tuple(cos.shape[:-1])
    if len(table_lead) > len(lead) or tuple(lead[len(lead) - len(table_lead) :]) != table_lead:
        raise ValueError(f"cos/sin {tuple(cos.shape)} do not broadcast over x {tuple(x.shape)}")
    xs = x.reshape(tokens, heads, d)
    if xs.stride(-1) != 1:
        xs = xs.contiguous()
    c = cos.reshape(-1, d)
    s = sin.reshape(-1, d)
    out = torch.empty((tokens, heads, d), device=x.device, dtype=x.dtype)
    _rms_norm_rope_kernel[(tokens * heads,)](
        xs,
        weight,
        c,
        s,
        out,
        heads,
        max(c.shape[0], 1),
        xs.stride(0),
        xs.stride(1),
        out.stride(0),
        out.stride(1),
        c.stride(0),
        s.stride(0),
        eps,
        HEAD_DIM=d,
    )
    return out.view(x.shape)
