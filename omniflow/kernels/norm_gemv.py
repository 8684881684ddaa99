"""A decoder layer's residual add, the RMSNorm that reads it and the projection after it, for
one activation row, in one Triton launch.

Why: at batch 1 a Qwen3 layer's norms sit between GEMVs that are a few microseconds each, so
the add + norm launch (`kernels.norm_rope.add_rms_norm`) and the gap it opens in a replayed
graph cost about as much as a projection. A 1.7B frame runs 28 talker layers and 14
single-token code-predictor steps of 5 layers, two such norms per layer: folding each into
the projection that reads it (q/k/v after the input norm, gate/up after the post-attention
norm) takes ~200 launches out of a batch-1 frame.

How: every program first reads the whole row (x + delta: 2-4 KB, from L2 after the first
program), forms the sum and its fp32 statistics, then streams its slab of the weight as
`kernels.skinny_gemm` does (one row, no split-K), normalising each input block as it loads
it. Program 0 also stores the sum (the new residual). Roundings are those of `add_rms_norm`
followed by `skinny_linear`: the sum rounded to the activation dtype, the normalised row
rounded before the norm weight multiplies it, that product rounded, fp32 dot products. Only
the order of the statistics' summation may differ from the separate norm kernel, so results
agree with the two launches to an ulp of the norm (tests/kernels/test_norm_gemv.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omniflow.kernels.skinny_gemm import SkinnyConfig


@triton.jit
def _norm_gemv_kernel(
    x_ptr,
    d_ptr,
    nw_ptr,
    w_ptr,
    sum_ptr,
    out_ptr,
    N,
    K,
    stride_wn,
    eps,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_K: tl.constexpr,
    ADD: tl.constexpr,
):
    """One program: out[rows] = W[rows] @ (nw * norm(x + d)) for its BLOCK_N weight rows."""
    pid = tl.program_id(0)
    cols_d = tl.arange(0, BLOCK_D)
    dmask = cols_d < K
    xs = tl.load(x_ptr + cols_d, mask=dmask, other=0.0)
    if ADD:
        ds = tl.load(d_ptr + cols_d, mask=dmask, other=0.0)
        xs = (xs.to(tl.float32) + ds.to(tl.float32)).to(xs.dtype)
        first = (cols_d * 0 + pid) == 0  # a vector mask: program 0 stores the sum
        tl.store(sum_ptr + cols_d, xs, mask=dmask & first)
    sf = xs.to(tl.float32)
    var = tl.sum(sf * sf, axis=0) / K
    inv = tl.math.rsqrt(var + eps)

    rows_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows_n < N
    cols = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows_n.to(tl.int64)[:, None] * stride_wn
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + cols
        if EVEN_K:
            w = tl.load(w_rows + k[None, :], mask=mask_n[:, None], other=0.0)
            x = tl.load(x_ptr + k)
            nw = tl.load(nw_ptr + k)
            if ADD:
                d = tl.load(d_ptr + k)
        else:
            kmask = k < K
            w = tl.load(w_rows + k[None, :], mask=mask_n[:, None] & kmask[None, :], other=0.0)
            x = tl.load(x_ptr + k, mask=kmask, other=0.0)
            nw = tl.load(nw_ptr + k, mask=kmask, other=0.0)
            if ADD:
                d = tl.load(d_ptr + k, mask=kmask, other=0.0)
        if ADD:
            x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        normed = (x.to(tl.float32) * inv).to(x.dtype).to(tl.float32)
        h = (nw.to(tl.float32) * normed).to(x.dtype)
        acc2 += w.to(tl.float32) * h.to(tl.float32)[None, :]
    acc = tl.sum(acc2, axis=1)
    tl.store(out_ptr + rows_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)


def _one_row(name: str, t: torch.Tensor, k: int) -> torch.Tensor:
    if t.numel() != k or t.shape[-1] != k:
        raise ValueError(f"norm_linear: {name} {tuple(t.shape)} must be one row of {k}")
    return t.reshape(k).contiguous()


def norm_linear(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    config: SkinnyConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, F.linear(RMSNorm(norm_weight, eps)(s), weight)) with s = x + delta (x itself when
    delta is None) for one row x [..., K] and weight [N, K], all of one dtype. `config` is
    the skinny GEMM's tile for the weight's shape (split_k must be 1). Returns s (x when
    delta is None) and the [..., N] product. Raises ValueError for what it cannot run."""
    if weight.dim() != 2:
        raise ValueError(f"norm_linear: weight must be [N, K], got {tuple(weight.shape)}")
    n, k = weight.shape
    tensors = {"x": x, "norm weight": norm_weight, "weight": weight}
    if delta is not None:
        tensors["delta"] = delta
    if any(t.dtype != x.dtype or t.device != x.device for t in tensors.values()):
        described = ", ".join(f"{name} {t.dtype} {t.device}" for name, t in tensors.items())
        raise ValueError(f"norm_linear: one dtype and device for all: {described}")
    if norm_weight.shape != (k,) or weight.stride(1) != 1:
        raise ValueError(
            f"norm_linear: norm weight {tuple(norm_weight.shape)} must be ({k},) and the "
            "weight contiguous along K"
        )
    if config.split_k != 1:
        raise ValueError(f"norm_linear: {config}: split-K is not supported")
    row = _one_row("x", x, k)
    out = torch.empty(*x.shape[:-1], n, device=x.device, dtype=x.dtype)
    total = x
    d = row
    if delta is not None:
        if delta.shape != x.shape:
            raise ValueError(f"norm_linear: delta {tuple(delta.shape)} != x {tuple(x.shape)}")
        d = _one_row("delta", delta, k)
        total = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(n, config.block_n),)
    _norm_gemv_kernel[grid](
        row,
        d,
        norm_weight,
        weight,
        total,
        out,
        n,
        k,
        weight.stride(0),
        eps,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        BLOCK_D=triton.next_power_of_2(k),
        EVEN_K=k % config.block_k == 0,
        ADD=delta is not None,
        num_warps=config.num_warps,
    )
    return total, out
