"""SwiGLU's gating, `silu(gate) * up`, as one Triton kernel (torch: two launches per layer).

Roundings as torch's bf16 ops: silu's result rounded to the activation dtype, then the
product rounded. `gate` and `up` may be the two halves of one packed projection's output
(row-strided views), read in place. Graph-safe (shapes alone fix the launch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(
    g_ptr, u_ptr, out_ptr, stride_g, stride_u, stride_out, n_cols, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (act * u.to(tl.float32)).to(g.dtype), mask=mask)


BLOCK = 1024


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`F.silu(gate) * up` for [..., N] on CUDA; gate and up of one shape and dtype, unit
    stride along the last axis (views of a packed output are fine)."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    n = gate.shape[-1]
    g = gate.reshape(-1, n)
    u = up.reshape(-1, n)
    if g.stride(-1) != 1 or u.stride(-1) != 1:
        g, u = g.contiguous(), u.contiguous()
    out = torch.empty(g.shape, device=gate.device, dtype=gate.dtype)
    grid = (g.shape[0], triton.cdiv(n, BLOCK))
    _silu_mul_kernel[grid](g, u, out, g.stride(0), u.stride(0), out.stride(0), n, BLOCK=BLOCK)
    return out.view(gate.shape)
