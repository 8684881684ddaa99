"""Attention over a paged KV cache, and over a small dense per-frame cache.

These are the clear torch reference implementations (one request at a time, so a row's
result never depends on what else is in the batch). Triton kernels, when they come, are
tested against them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass(frozen=True)
class PagedAttentionMetadata:
    """Where this step's tokens sit in the flattened batch and in the block pool."""

    slot_mapping: torch.Tensor
    """[T] cache slot of each new token (block id * block size + offset)."""
    query_starts: tuple[int, ...]
    """B + 1 offsets of each request's tokens in the flattened batch."""
    seq_lens: tuple[int, ...]
    """Context length of each request after this step."""
    context_slots: tuple[torch.Tensor, ...]
    """Per request, the cache slots of its whole context, in position order."""
    padded_slots: torch.Tensor | None = None
    """Batched decode (every request computes one token): [B, L] context slots padded to the
    longest context, with `padded_mask` [B, L] marking the real ones. None: per request."""
    padded_mask: torch.Tensor | None = None


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    k_cache.index_copy_(0, slots, k)
    v_cache.index_copy_(0, slots, v)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
) -> torch.Tensor:
    """q: [T, Hq, D]; caches: [slots, Hkv, D] (this step's K/V already written)."""
    out = torch.empty_like(q)
    starts = meta.query_starts
    for b, ctx in enumerate(meta.seq_lens):
        s, e = starts[b], starts[b + 1]
        n = e - s
        slots = meta.context_slots[b]
        qb = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        kb = k_cache[slots].transpose(0, 1).unsqueeze(0)  # [1, Hkv, ctx, D]
        vb = v_cache[slots].transpose(0, 1).unsqueeze(0)
        mask = None
        if n > 1:
            qpos = torch.arange(ctx - n, ctx, device=q.device)
            mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]
        ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, enable_gqa=True)
        out[s:e] = ob.squeeze(0).transpose(0, 1)
    return out


def dense_causal_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
) -> torch.Tensor:
    """q: [B, L, Hq, D] at positions start..start+L-1; caches: [B, S, Hkv, D] filled to
    start + L. Every row of the batch has the same positions (code-predictor frames)."""
    length = q.shape[1]
    ctx = start + length
    qb = q.transpose(1, 2)
    kb = k_cache[:, :ctx].transpose(1, 2)
    vb = v_cache[:, :ctx].transpose(1, 2)
    mask = None
    if length > 1:
        qpos = torch.arange(start, ctx, device=q.device)
        mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
) -> torch.Tensor:
    """Every request decodes one token: one gather and one SDPA for the whole batch (the
    per-request loop costs a few launches per request per layer). q: [B, Hq, D]. Padded keys
    are masked out; the result equals `paged_attention` up to summation order."""
    assert meta.padded_slots is not None and meta.padded_mask is not None
    b, hq, d = q.shape
    k = k_cache[meta.padded_slots].transpose(1, 2)  # [B, Hkv, L, D]
    v = v_cache[meta.padded_slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q.view(b, 1, hq, d).transpose(1, 2),
        k,
        v,
        attn_mask=meta.padded_mask[:, None, None, :],
        enable_gqa=True,
    )
    return out.transpose(1, 2).reshape(b, hq, d)
