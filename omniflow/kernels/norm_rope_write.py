"""The talker's q/k RMSNorm + rotary and its K/V write into the paged cache, in one Triton
launch per layer: in the decode step and in the whole-prompt prefill (which also keeps the
normalised K, `k_out=`, to attend over its own tokens).

Why: the talker's attention was four launches before the attention kernel itself (the q and
k norm+rotary kernels, two `index_copy_` writes of K and V into the block pool); with 28
layers that is over a hundred launches per step, each adding its latency to the captured
graph, in the decode step and in the prefill replay alike. One
program per (token, KV head) normalises and rotates its K head and the GQA group's query
heads, and stores K and V at the token's slot.

Semantics: `norm_rope.rms_norm_rope` on q and k (same roundings, `norm_rope_row`), then
`layers.attention.write_kv` (K/V at `slot_mapping`); returns the normalised, rotated q. A
padding row's slot is the runner's dummy slot, so its writes land where nothing reads.
Graph-safe: shapes alone fix the launch; slots are read in the kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omniflow.kernels.args import NormRopeArgs
from omniflow.kernels.checks import require_like, require_unit_stride
from omniflow.kernels.norm_rope import norm_rope_row


@triton.jit
def _norm_rope_write_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    qo_ptr,
    ko_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ct,
    stride_st,
    stride_cs,
    stride_ch,
    stride_ot,
    stride_oh,
    stride_kot,
    stride_koh,
    eps,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    STORE_K: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, HEAD_DIM)
    cos_row = cos_ptr + t * stride_ct
    sin_row = sin_ptr + t * stride_st
    k = norm_rope_row(
        k_ptr + t * stride_kt + h * stride_kh, kw_ptr, cos_row, sin_row, eps, HEAD_DIM
    )
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + cols)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    tl.store(kc_ptr + slot * stride_cs + h * stride_ch + cols, k)
    tl.store(vc_ptr + slot * stride_cs + h * stride_ch + cols, v)
    if STORE_K:
        tl.store(ko_ptr + t * stride_kot + h * stride_koh + cols, k)
    for g in tl.static_range(GROUP):
        qh = h * GROUP + g
        q = norm_rope_row(
            q_ptr + t * stride_qt + qh * stride_qh, qw_ptr, cos_row, sin_row, eps, HEAD_DIM
        )
        tl.store(qo_ptr + t * stride_ot + qh * stride_oh + cols, q)


def norm_rope_write(
    args: NormRopeArgs, slot_mapping: torch.Tensor, k_out: torch.Tensor | None = None
) -> torch.Tensor:
    """q [T, Hq, D], k, v [T, Hkv, D] as projected; cos, sin [T, D]; caches [slots, Hkv, D];
    slot_mapping [T]. Writes normalised, rotated K and V at the slots and returns the
    normalised, rotated q [T, Hq, D]; with `k_out` ([T, Hkv, D], unit last stride) the
    normalised, rotated K lands there too: a prefill attends to its own tokens' K directly
    (`prompt_graph.py`), where the decode step reads it back from the cache."""
    q, k, v, cos, sin, k_cache = args.q, args.k, args.v, args.cos, args.sin, args.k_cache
    tokens, hq, d = q.shape
    hkv = k.shape[1]
    if k.shape != (tokens, hkv, d) or v.shape != k.shape or hq % hkv:
        raise ValueError(f"norm_rope_write: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if cos.shape != (tokens, d) or sin.shape != cos.shape or slot_mapping.shape != (tokens,):
        raise ValueError(f"norm_rope_write: cos {tuple(cos.shape)}, slots for {tokens} tokens")
    if k_cache.shape[1:] != (hkv, d) or args.v_cache.stride() != k_cache.stride():
        raise ValueError(f"norm_rope_write: cache {tuple(k_cache.shape)} for k {tuple(k.shape)}")
    tensors = (("q", q), ("k", k), ("v", v), ("cos", cos), ("sin", sin), ("cache", k_cache))
    require_unit_stride("norm_rope_write", tensors)
    if k_out is not None:
        require_like("norm_rope_write", "k_out", k_out, "k", k)
    out = torch.empty((tokens, hq, d), device=q.device, dtype=q.dtype)
    ko = out if k_out is None else k_out  # never written without STORE_K
    _norm_rope_write_kernel[(tokens, hkv)](
        *args.tensors(),
        slot_mapping,
        out,
        ko,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        sin.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        out.stride(0),
        out.stride(1),
        ko.stride(0),
        ko.stride(1),
        args.eps,
        GROUP=hq // hkv,
        HEAD_DIM=d,
        STORE_K=k_out is not None,
    )
    return out
