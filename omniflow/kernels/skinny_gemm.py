"""`F.linear(x, weight)` for a handful of activation rows ("skinny GEMM"), in Triton.

Why: a Qwen3-TTS 1.7B decode step multiplies one (or a few) activation rows by every weight
matrix, so each linear layer is a pass over its weight and nothing else: a memory-bound GEMV.
cuBLAS(Lt) picks tiles made for large M, which at M=1 leave most SMs idle, so its bf16 GEMVs
reach a fraction of the memory bandwidth (measured: docs/performance.md, "Skinny GEMM"). Here
the N rows of the weight are cut into slabs of `block_n` rows, one program per slab (and per K
split), so that the grid has a couple of programs per SM; each program streams its slab along K
in `block_k`-wide, unit-stride loads and accumulates in fp32. `benchmarks/gemv_bench.py`
(outside the package) measures it against cuBLAS at the model's shapes and prints a tuned
config table.

Semantics: out[m, n] = sum_k x[m, k] * weight[n, k] for x [..., K] (leading dims flattened
into M <= MAX_M rows) and weight [N, K], both of one dtype (bf16, fp16 or fp32). Products and
sums are fp32 (bf16/fp16 products are exact in fp32; fp32 inputs use IEEE fp32, not TF32) and
the result is rounded to the dtype once. The summation order differs from cuBLAS, so results
agree to rounding, not bitwise; they are bitwise reproducible run to run: split-K writes fp32
partials [split_k, M, N] to a scratch buffer and a second (tiny) launch adds them in a fixed
order, no atomics. That second launch costs ~a few microseconds of latency, so split_k > 1 only
pays where N alone gives too few programs.

Two inner loops, chosen by M: up to 8 rows the products are CUDA-core FMAs on the [block_n,
block_k] weight tile (one row of x at a time); above, the rows are padded to 16 or 32 and the
tile goes through `tl.dot` (tensor cores), which then needs block_n >= 16.

Launches depend on shapes alone (no host read of tensor values; the split-K scratch is a
`torch.empty` per call, which the caching allocator serves inside CUDA graph capture too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_M = 32
FMA_MAX_M = 8  # up to this many rows: CUDA-core FMAs; above: tl.dot on rows padded to 16/32
NUM_SMS = 132  # SM count of the card TUNED_ONE_ROW was tuned on (an H200)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class SkinnyConfig:
    """Tile shape and launch options: block_n weight rows per program, block_k columns per
    step, num_warps, and split_k programs sharing one slab's K range (a second launch sums
    their fp32 partials)."""

    block_n: int
    block_k: int
    num_warps: int
    split_k: int = 1


TUNED_ONE_ROW: dict[tuple[int, int], SkinnyConfig] = {
    # (N, K): best config for one activation row, with its median and cuBLAS's (us).
    # Code predictor (1.7B): qkv, o, gate_up, down, lm_head, input projection.
    (4096, 1024): SkinnyConfig(block_n=8, block_k=512, num_warps=4),  # 4.14 vs 5.00
    (1024, 2048): SkinnyConfig(block_n=8, block_k=512, num_warps=4),  # 4.53 vs 13.14
    (6144, 1024): SkinnyConfig(block_n=16, block_k=512, num_warps=8),  # 5.36 vs 6.11
    (1024, 3072): SkinnyConfig(block_n=8, block_k=512, num_warps=4, split_k=4),  # 5.53 vs 6.76
    (2048, 1024): SkinnyConfig(block_n=8, block_k=512, num_warps=4),  # 3.53 vs 4.73
    # Talker (1.7B): qkv, o, gate_up, down, codec head.
    (4096, 2048): SkinnyConfig(block_n=16, block_k=512, num_warps=8),  # 6.54 vs 7.22
    (2048, 2048): SkinnyConfig(block_n=16, block_k=512, num_warps=8),  # 5.18 vs 6.17
    (12288, 2048): SkinnyConfig(block_n=32, block_k=256, num_warps=8),  # 14.12 vs 15.86
    (2048, 6144): SkinnyConfig(block_n=16, block_k=512, num_warps=8, split_k=2),  # 10.01 vs 11.05
    (3072, 2048): SkinnyConfig(block_n=8, block_k=512, num_warps=4),  # 5.94 vs 6.64
}
"""Where the kernel beats cuBLAS, from `python -m benchmarks.gemv_bench --m 1 8` (bf16
weights read from HBM, graph-replayed; measured: docs/performance.md, "Skinny GEMM"). Only
one row: at 8 rows cuBLAS was faster at every shape, so the model layers use the kernel for
single-row calls of these shapes only (`omniflow.models.layers.linear`)."""


def block_m(m: int) -> int:
    """Rows per tile: the next power of two >= m, at least 16 on the tl.dot path."""
    bm = triton.next_power_of_2(m)
    return bm if bm <= FMA_MAX_M else max(16, bm)


def default_config(m: int, n: int, k: int) -> SkinnyConfig:
    """A config without measurements.

    block_n: the largest of 64/32/16/8 that still gives >= 2 programs per SM (264 on 132 SMs),
    so that every SM streams weight and a second resident program hides the first one's load
    latency; where N is too small for that, the smallest block_n (most programs). block_k:
    the FMA path holds a [block_n, block_k] fp32 tile in registers, so block_n * block_k is
    4096 (32 values per thread with 4 warps) where block_k >= 128 allows; the tl.dot path
    stages tiles in shared memory and takes 128 columns. Both stop at K's next power of two.
    split_k stays 1: its second launch costs more than it saves at these sizes unless a
    measurement says otherwise (see gemv_bench's tuned table).
    """
    dot = block_m(m) > FMA_MAX_M
    sizes = (64, 32, 16) if dot else (64, 32, 16, 8)
    block_n = next((b for b in sizes if triton.cdiv(n, b) >= 2 * NUM_SMS), sizes[-1])
    block_k = 128 if dot else max(128, min(512, 4096 // block_n))
    floor = 16 if dot else 1
    block_k = max(floor, min(block_k, triton.next_power_of_2(k)))
    return SkinnyConfig(block_n=block_n, block_k=block_k, num_warps=4)


@triton.jit
def _row_input(x_ptr, u_ptr, k, kmask, GATED: tl.constexpr, MASKED: tl.constexpr):
    """One row's input at columns k (`kmask` applied when MASKED): x, or with GATED
    silu(x) * u rounded as `silu_mul` rounds it."""
    if MASKED:  # noqa: SIM108 (a static branch on a constexpr, as Triton compiles it)
        x = tl.load(x_ptr + k, mask=kmask, other=0.0)
    else:
        x = tl.load(x_ptr + k)
    if GATED:
        if MASKED:  # noqa: SIM108
            u = tl.load(u_ptr + k, mask=kmask, other=0.0)
        else:
            u = tl.load(u_ptr + k)
        gf = x.to(tl.float32)
        act = (gf / (1.0 + tl.exp(-gf))).to(x.dtype).to(tl.float32)
        x = (act * u.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _skinny_kernel(
    x_ptr,
    u_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_wn,
    stride_os,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    GATED: tl.constexpr,
):
    """One program: rows [pid_n * BLOCK_N, +BLOCK_N) of the weight over the K range of split
    pid_s; writes out[pid_s, :M, those rows] (rounded to out's dtype: the result, or fp32
    partials when split). GATED (one row only): the input is silu(x) * u, computed as it is
    loaded and rounded as `silu_mul` rounds it."""
    tl.static_assert(not GATED or BLOCK_M == 1, "the gated input is for one row only")
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    mask_n = rows_n < N
    mask_m = rows_m < M
    k_start = pid_s * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_rows = w_ptr + rows_n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if USE_DOT:
        x_rows = x_ptr + rows_m.to(tl.int64)[:, None] * stride_xm
        for k0 in range(k_start, k_end, BLOCK_K):
            k = k0 + cols
            if EVEN_K:
                w = tl.load(w_rows + k[None, :], mask=mask_n[:, None], other=0.0)
                x = tl.load(x_rows + k[None, :], mask=mask_m[:, None], other=0.0)
            else:
                kmask = k < k_end
                w = tl.load(w_rows + k[None, :], mask=mask_n[:, None] & kmask[None, :], other=0.0)
                x = tl.load(x_rows + k[None, :], mask=mask_m[:, None] & kmask[None, :], other=0.0)
            if w.dtype == tl.float32:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
    elif BLOCK_M == 1:
        # One row: accumulate the elementwise products, reduce once at the end.
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            k = k0 + cols
            if EVEN_K:
                w = tl.load(w_rows + k[None, :], mask=mask_n[:, None], other=0.0)
                x = _row_input(x_ptr, u_ptr, k, cols, GATED, False)
            else:
                kmask = k < k_end
                w = tl.load(w_rows + k[None, :], mask=mask_n[:, None] & kmask[None, :], other=0.0)
                x = _row_input(x_ptr, u_ptr, k, kmask, GATED, True)
            acc2 += w.to(tl.float32) * x.to(tl.float32)[None, :]
        acc += tl.sum(acc2, axis=1)[None, :]
    else:
        for k0 in range(k_start, k_end, BLOCK_K):
            k = k0 + cols
            if EVEN_K:
                kmask = cols < BLOCK_K
                w = tl.load(w_rows + k[None, :], mask=mask_n[:, None], other=0.0)
            else:
                kmask = k < k_end
                w = tl.load(w_rows + k[None, :], mask=mask_n[:, None] & kmask[None, :], other=0.0)
            w = w.to(tl.float32)
            for m in tl.static_range(BLOCK_M):
                xmask = kmask & (tl.full((BLOCK_K,), m, tl.int32) < M)
                x = tl.load(x_ptr + m * stride_xm + k, mask=xmask, other=0.0)
                part = tl.sum(w * x.to(tl.float32)[None, :], axis=1)
                acc = tl.where(rows_m[:, None] == m, acc + part[None, :], acc)
    out = out_ptr + pid_s.to(tl.int64) * stride_os + rows_m[:, None] * stride_om + rows_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, total, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = sum over s of part[s, i], s in order 0..SPLIT_K-1 (reproducible), rounded."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < total
    acc = tl.load(part_ptr + i, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(part_ptr + s * total + i, mask=mask, other=0.0)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig, m: int) -> None:
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"skinny_linear: x has K={x.shape[-1]} but weight {tuple(weight.shape)} has K="
            f"{weight.shape[1]}"
        )
    if x.dtype != weight.dtype or x.dtype not in DTYPES:
        raise ValueError(
            f"skinny_linear: dtype of x ({x.dtype}) and weight ({weight.dtype}) must be one of "
            f"{DTYPES}, the same"
        )
    if x.device != weight.device:
        raise ValueError(f"skinny_linear: x on {x.device}, weight on {weight.device}")
    if weight.stride(1) != 1:
        raise ValueError("skinny_linear: weight must have unit stride along K (contiguous rows)")
    if m > MAX_M:
        raise ValueError(f"skinny_linear: M={m} rows, more than MAX_M={MAX_M}; use F.linear")
    pow2 = (config.block_n, config.block_k, config.num_warps)
    if any(v < 1 or v & (v - 1) for v in pow2) or config.split_k < 1:
        raise ValueError(f"skinny_linear: {config}: sizes must be powers of two, split_k >= 1")
    if block_m(m) > FMA_MAX_M and (config.block_n < 16 or config.block_k < 16):
        raise ValueError(f"skinny_linear: {config}: M={m} uses tl.dot, needs block_n/k >= 16")


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: SkinnyConfig | None = None,
    *,
    out: torch.Tensor | None = None,
    up: torch.Tensor | None = None,
) -> torch.Tensor:
    """`F.linear(x, weight)` (no bias) for x [..., K] with at most MAX_M rows, weight [N, K].

    `out`, if given, is a contiguous [..., N] tensor of x's dtype that receives the result
    (every element is written). `up`, if given (one row only, x's shape and dtype): the input
    is `silu(x) * up` instead of x, exactly as `kernels.silu_mul` computes it, so SwiGLU's
    gating and the down projection are one launch. Raises ValueError for shapes, dtypes,
    devices or configs it cannot run (M > MAX_M included: use F.linear)."""
    if weight.dim() != 2 or x.dim() < 1:
        raise ValueError(f"skinny_linear: weight must be [N, K], got {tuple(weight.shape)}")
    n, k = weight.shape[0], x.shape[-1]
    lead = tuple(x.shape[:-1])
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    cfg = config or default_config(m, n, k)
    _check(x, weight, cfg, m)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    ups = rows
    if up is not None:
        if m != 1 or up.shape != x.shape or up.dtype != x.dtype:
            raise ValueError(
                f"skinny_linear: up {tuple(up.shape)} {up.dtype} must match x {tuple(x.shape)} "
                f"{x.dtype}, one row"
            )
        ups = up.reshape(1, k).contiguous()
    if out is None:
        out = torch.empty(*lead, n, device=x.device, dtype=x.dtype)
    elif out.shape != (*lead, n) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"skinny_linear: out must be contiguous {(*lead, n)} {x.dtype}")
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    bm = block_m(m)
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    even_k = k % cfg.block_k == 0
    if cfg.split_k == 1:
        dest = out.view(m, n)
        stride_os = 0
    else:
        dest = torch.empty(cfg.split_k, m, n, device=x.device, dtype=torch.float32)
        stride_os = dest.stride(0)
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    _skinny_kernel[grid](
        rows,
        ups,
        weight,
        dest,
        m,
        n,
        k,
        k_per_split,
        rows.stride(0),
        weight.stride(0),
        stride_os,
        n,
        BLOCK_M=bm,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVEN_K=even_k,
        USE_DOT=bm > FMA_MAX_M,
        GATED=up is not None,
        num_warps=cfg.num_warps,
    )
    if cfg.split_k > 1:
        total = m * n
        _sum_splits_kernel[(triton.cdiv(total, 1024),)](
            dest, out, total, SPLIT_K=cfg.split_k, BLOCK=1024, num_warps=4
        )
    return out
