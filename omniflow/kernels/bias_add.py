"""A convolution's per-channel bias added after it ran without one, with an optional
residual, as one Triton kernel: `out = residual + (x + bias[c])`.

Why: torch adds a convolution's bias as a broadcast add over its whole output, on its
generic (unvectorised) elementwise path, a full extra pass over every convolution's output
of the streaming codec decoder (its largest elementwise item at large batches; measured: see
docs/performance.md). A residual unit's last convolution is followed by the residual add,
another full pass; a transposed convolution's output is a view into a wider buffer (its
overlap tail is carried to the next pass), which torch first copies out. Here each is one
read of each operand and one write. Computed in float32 in torch's order (`x + bias` first),
so in float32 the sums are torch's; a bf16 one rounds once, at the store (torch rounds after
each sum).
Graph-safe: shapes alone fix the launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _bias_add_kernel(
    x_ptr,
    bias_ptr,
    res_ptr,
    out_ptr,
    n,
    n_channels,
    length,
    row_stride,
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    HAS_RES: tl.constexpr,
):
    """Flat over the contiguous output [rows, length]; row r of `x` starts at r * row_stride
    (a view of the first `length` columns of a wider buffer)."""
    if WIDE:  # 2**31 elements or more: 64-bit offsets
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    row = offs // length
    t = offs - row * length
    x = tl.load(x_ptr + row * row_stride + t, mask=mask, other=0.0)
    b = tl.load(bias_ptr + row % n_channels, mask=mask, other=0.0)
    y = x.to(tl.float32) + b.to(tl.float32)
    if HAS_RES:
        y = tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32) + y
    tl.store(out_ptr + offs, y.to(x.dtype), mask=mask)


BLOCK = 1024


def bias_add(
    x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """`residual + (x + bias[None, :, None])` as a new contiguous tensor of x's dtype. x
    [B, C, T] may be a view whose rows are strided (contiguous along T, as `y[..., :n]` of a
    contiguous y); residual [B, C, T] of x's dtype, or None."""
    if x.dim() != 3 or bias.shape != (x.shape[1],):
        raise ValueError(
            f"bias_add: x {tuple(x.shape)} must be [B, C, T] with bias {tuple(bias.shape)} [C]"
        )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"bias_add: residual {tuple(residual.shape)} {residual.dtype} must match x "
            f"{tuple(x.shape)} {x.dtype}"
        )
    b, c, t = x.shape
    rows_evenly = x.stride(2) == 1 and x.stride(1) >= t and x.stride(0) == c * x.stride(1)
    if not rows_evenly:
        x = x.contiguous()
    out = torch.empty((b, c, t), device=x.device, dtype=x.dtype)
    n = out.numel()
    if n == 0:
        return out
    res = None if residual is None else residual.contiguous()
    bias = bias.contiguous()  # read at its channel index
    grid = (triton.cdiv(n, BLOCK),)
    _bias_add_kernel[grid](
        x,
        bias,
        x if res is None else res,  # not read without HAS_RES
        out,
        n,
        c,
        t,
        x.stride(1),
        BLOCK=BLOCK,
        WIDE=max(n, b * c * x.stride(1)) >= 2**31,
        HAS_RES=res is not None,
    )
    return out
