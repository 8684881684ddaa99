"""The code predictor's attention in one Triton launch per token: q/k RMSNorm and rotary,
the new K/V written into the frame's dense cache, and attention over the (at most 16) cached
positions (`frame_attention`; a pass of several tokens, the first of a frame, is one launch
per token in order: `frame_pass`).

Why: a code-predictor frame is 15 sequential passes of 5 layers, and 14 of those passes feed
one token per row. Each layer's attention was five launches on the GPU (the q and k
norm+rotary kernels, two slice copies into the cache, a flash-attention call whose fixed
cost dwarfs a 16-key context): at batch 1 those launches, not their work, are a large share
of a layer's time (measured: see docs/performance.md). Here one program per (row, KV head)
does all of it.

Semantics, against the torch path it replaces (`rms_norm_rope` on q and k, the cache slice
assignment, `dense_causal_attention`): q and k are normalised and rotated with the same
roundings (`norm_rope.norm_rope_row`), so the cached K/V are identical; the scores, softmax
and weighted sum run in fp32 with one rounding of the output (flash attention rounds the
probabilities to bf16 before the second product), so the output agrees to bf16 rounding,
not bitwise. GQA as `enable_gqa`: query head i reads KV head i // (Hq / Hkv).

The new token's K/V are used from registers for its own position, so no program reads a
cache row it wrote in the same launch (no barrier needed), and padding rows (zeros) stay
finite. Graph-safe: `start` is a Python int fixed per call site, shapes fix the launch.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from omniflow.kernels.args import NormRopeArgs
from omniflow.kernels.checks import require_like, require_unit_stride
from omniflow.kernels.norm_rope import norm_rope_row

NUM_WARPS = 1
"""One warp per (row, KV head) program, faster than Triton's default four at every batch
(measured: see docs/performance.md). A program's work is a [16, 128] tile and two query
heads: more warps only add cross-warp reductions and fewer programs resident per SM."""


@triton.jit
def _frame_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    qw_ptr,
    kw_ptr,
    cos_row,
    sin_row,
    kc_ptr,
    vc_ptr,
    out_ptr,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_ob,
    stride_oh,
    start,
    eps,
    scale,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    S_BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, HEAD_DIM)
    # The cached positions' loads first: none of them reads the row this program stores,
    # so they need not wait for the new token's norm and rotary (one memory round trip
    # less on the program's critical path).
    cache = b * stride_cb + h * stride_ch
    pos = tl.arange(0, S_BLOCK)
    old = (pos < start)[:, None]
    offs = cache + pos[:, None] * stride_cs + cols[None, :]
    keys = tl.load(kc_ptr + offs, mask=old, other=0.0).to(tl.float32)
    vals = tl.load(vc_ptr + offs, mask=old, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols)
    k_row = k_ptr + b * stride_kb + h * stride_kh
    k = norm_rope_row(k_row, kw_ptr, cos_row, sin_row, eps, HEAD_DIM)
    new = (pos == start)[:, None]
    keys = tl.where(new, k.to(tl.float32)[None, :], keys)
    vals = tl.where(new, v.to(tl.float32)[None, :], vals)
    visible = pos <= start
    for g in tl.static_range(GROUP):
        qh = h * GROUP + g
        q = norm_rope_row(
            q_ptr + b * stride_qb + qh * stride_qh, qw_ptr, cos_row, sin_row, eps, HEAD_DIM
        )
        scores = tl.sum(q.to(tl.float32)[None, :] * keys, axis=1) * scale
        scores = tl.where(visible, scores, float("-inf"))
        p = tl.exp(scores - tl.max(scores, axis=0))
        p = p / tl.sum(p, axis=0)
        o = tl.sum(p[:, None] * vals, axis=0)
        tl.store(out_ptr + b * stride_ob + qh * stride_oh + cols, o.to(out_ptr.dtype.element_ty))
    tl.store(kc_ptr + cache + start * stride_cs + cols, k)
    tl.store(vc_ptr + cache + start * stride_cs + cols, v)


def frame_attention(
    args: NormRopeArgs, start: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """One token per row at position `start`: q [B, 1, Hq, D], k, v [B, 1, Hkv, D] as they
    come out of the projection (before the q/k norms and rotary); cos, sin [1, D] (the
    position's table row); caches [B, S, Hkv, D], positions < start already filled. Writes
    the token's normalised, rotated K and its V at `start` and returns the attention output
    [B, 1, Hq, D] (into `out` when given: a view of that shape with unit last stride)."""
    q, k, v, cos, sin, k_cache = args.q, args.k, args.v, args.cos, args.sin, args.k_cache
    bsz, length, hq, d = q.shape
    hkv = k.shape[2]
    s = k_cache.shape[1]
    if length != 1 or k.shape != (bsz, 1, hkv, d) or v.shape != k.shape:
        raise ValueError(f"frame_attention: one token per row, got q {tuple(q.shape)}")
    if hq % hkv or not 0 <= start < s:
        raise ValueError(f"frame_attention: {hq} q heads, {hkv} kv heads, start {start} of {s}")
    if k_cache.shape != (bsz, s, hkv, d) or args.v_cache.stride() != k_cache.stride():
        raise ValueError(f"frame_attention: cache {tuple(k_cache.shape)} for {tuple(k.shape)}")
    if cos.shape != (1, d) or sin.shape != (1, d):
        raise ValueError(f"frame_attention: cos/sin {tuple(cos.shape)}, one row of {d} needed")
    tensors = (("q", q), ("k", k), ("v", v), ("cache", k_cache), ("cos", cos), ("sin", sin))
    require_unit_stride("frame_attention", tensors)
    if out is None:
        out = torch.empty((bsz, 1, hq, d), device=q.device, dtype=q.dtype)
    else:
        require_like("frame_attention", "out", out, "q", q)
    _frame_attention_kernel[(bsz, hkv)](
        *args.tensors(),
        out,
        q.stride(0),
        q.stride(2),
        k.stride(0),
        k.stride(2),
        v.stride(0),
        v.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        out.stride(0),
        out.stride(2),
        start,
        args.eps,
        d**-0.5,
        GROUP=hq // hkv,
        HEAD_DIM=d,
        S_BLOCK=triton.next_power_of_2(s),
        num_warps=NUM_WARPS,
    )
    return out


def frame_pass(args: NormRopeArgs, start: int) -> torch.Tensor:
    """A pass of L tokens per row at positions start..start+L-1 (q [B, L, Hq, D], k, v
    [B, L, Hkv, D] as projected; cos, sin [L, D]) as L `frame_attention` launches in order,
    each writing its token's K/V before the next reads it: causal attention over the cache,
    token by token. Why: the code predictor's first pass of a frame (two tokens from
    position 0) otherwise takes two norm+rotary launches, two cache copies and a flash
    attention call per layer, that last call alone costing several `frame_attention`
    launches (measured: see docs/performance.md)."""
    q, k, v, cos, sin = args.q, args.k, args.v, args.cos, args.sin
    length = q.shape[1]
    if k.shape[1] != length or v.shape[1] != length:
        raise ValueError(f"frame_pass: {length} queries, {k.shape[1]} keys, {v.shape[1]} values")
    if cos.shape[0] != length or sin.shape[0] != length:
        raise ValueError(f"frame_pass: {length} tokens, cos/sin rows {cos.shape[0]}")
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    for i in range(length):
        token = slice(i, i + 1)
        one = replace(
            args, q=q[:, token], k=k[:, token], v=v[:, token], cos=cos[token], sin=sin[token]
        )
        frame_attention(one, start + i, out=out[:, token])
    return out
