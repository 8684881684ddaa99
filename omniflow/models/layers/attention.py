"""Attention over a paged KV cache, and over a small dense per-frame cache.

These are the clear torch reference implementations (one request at a time, so a row's
result never depends on what else is in the batch). Triton kernels, when they come, are
tested against them.

Two metadata types, one per input path: `PagedAttentionMetadata` for mixed steps (prefill
chunks, recompute: several tokens per request, per-request context slots built on the host)
and `DecodeAttentionMetadata` for decode steps (one token per request), which carries what a
paged decode kernel reads: block tables [B, max_blocks] and context lengths [B].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F


@dataclass(frozen=True)
class PaddedIndex:
    """A mixed step laid out as one padded batch: request b's queries are its last n_b
    context positions; row b holds them in columns [0, n_b) and its context slots in
    columns [0, ctx_b). Built once per step on the host (`from_lengths`), used by every
    layer: one gather and one SDPA per layer instead of a loop over requests."""

    query_rows: torch.Tensor
    """[B, N] int64 row of each padded query in the flattened batch (padding: 0)."""
    valid_rows: torch.Tensor
    """[T] int64 index of each real query in the flattened [B * N] padded rows, in batch
    order: `index_select` with it un-pads without a boolean mask (whose nonzero would read
    the device back once per layer, stalling the eager prefill's launches each time)."""
    context_slots: torch.Tensor
    """[B, C] int64 cache slot of each context position (padding: 0)."""
    mask: torch.Tensor
    """[B, 1, N, C] bool: key j is visible to query i (inside the context and causal)."""

    @classmethod
    def from_lengths(
        cls,
        query_starts: tuple[int, ...],
        seq_lens: tuple[int, ...],
        context_slots: list[list[int]],
        device: torch.device,
    ) -> PaddedIndex:
        b = len(seq_lens)
        counts = np.diff(np.asarray(query_starts, dtype=np.int64))
        n, c = int(counts.max()), max(seq_lens)
        cols = np.arange(n)
        rows = np.asarray(query_starts[:-1], dtype=np.int64)[:, None] + cols
        valid = cols[None, :] < counts[:, None]
        slots = np.zeros((b, c), dtype=np.int64)
        for i, ctx in enumerate(context_slots):
            slots[i, : len(ctx)] = ctx
        lens = np.asarray(seq_lens, dtype=np.int64)
        last = lens[:, None] - counts[:, None] + cols[None, :]  # position of query i
        keys = np.arange(c)
        mask = (keys[None, None, :] <= last[:, :, None]) & valid[:, :, None]
        mask &= keys[None, None, :] < lens[:, None, None]
        return cls(
            torch.from_numpy(np.where(valid, rows, 0)).to(device),
            torch.from_numpy(np.flatnonzero(valid)).to(device),
            torch.from_numpy(slots).to(device),
            torch.from_numpy(mask[:, None]).to(device),
        )


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
    padded: PaddedIndex | None = None
    """Set: the whole step as one padded SDPA per layer (CUDA); None: request by request,
    so a row never depends on its neighbours (the CPU reference)."""

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        if self.padded is not None:
            return padded_attention(q, k_cache, v_cache, self.padded)
        return paged_attention(q, k_cache, v_cache, self)


@dataclass(frozen=True)
class DecodeAttentionMetadata:
    """Every request computes one token. Build with `from_tables`, which derives the torch
    path's gather index and mask from the block tables on the device (once per step, not
    per layer)."""

    slot_mapping: torch.Tensor
    """[B] int64 cache slot of each new token."""
    block_tables: torch.Tensor
    """[B, max_blocks] int32 block ids per request (entries past a request's blocks: 0)."""
    context_lens: torch.Tensor
    """[B] int32 context length of each request after this step."""
    block_size: int
    seq_lens: tuple[int, ...]
    """Host copy of `context_lens`: the torch paths size their gathers from it (a
    graph-captured kernel reads only the tensors)."""
    batched: bool
    """One padded SDPA for the whole batch; False: one request at a time, so a row never
    depends on its neighbours (bitwise batch-invariant, the CPU reference)."""
    gather_slots: torch.Tensor
    """[B, L] int64 context slots per request, L = the longest context (derived)."""
    gather_mask: torch.Tensor
    """[B, L] bool: which of `gather_slots` are real (derived)."""

    @classmethod
    def from_tables(
        cls,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        block_size: int,
        seq_lens: tuple[int, ...],
        batched: bool,
    ) -> DecodeAttentionMetadata:
        longest = max(seq_lens)
        dev = block_tables.device
        blocks = block_tables[:, : -(-longest // block_size)].to(torch.int64)
        offsets = torch.arange(block_size, device=dev, dtype=torch.int64)
        slots = (blocks[:, :, None] * block_size + offsets).flatten(1)[:, :longest]
        mask = torch.arange(longest, device=dev)[None, :] < context_lens[:, None]
        return cls(
            slot_mapping, block_tables, context_lens, block_size, seq_lens, batched, slots, mask
        )

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        return paged_decode_attention(q, k_cache, v_cache, self)


AttentionMetadata = PagedAttentionMetadata | DecodeAttentionMetadata


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    k_cache.index_copy_(0, slots, k)
    v_cache.index_copy_(0, slots, v)


def _attend_request(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """One request's n queries [n, Hq, D] (its last n positions) over its context `slots`."""
    n, ctx = q.shape[0], slots.shape[0]
    qb = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
    kb = k_cache[slots].transpose(0, 1).unsqueeze(0)  # [1, Hkv, ctx, D]
    vb = v_cache[slots].transpose(0, 1).unsqueeze(0)
    mask = None
    if n > 1:
        qpos = torch.arange(ctx - n, ctx, device=q.device)
        mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]
    ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, enable_gqa=True)
    return ob.squeeze(0).transpose(0, 1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
) -> torch.Tensor:
    """q: [T, Hq, D]; caches: [slots, Hkv, D] (this step's K/V already written)."""
    out = torch.empty_like(q)
    starts = meta.query_starts
    for b in range(len(meta.seq_lens)):
        s, e = starts[b], starts[b + 1]
        out[s:e] = _attend_request(q[s:e], k_cache, v_cache, meta.context_slots[b])
    return out


def padded_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, index: PaddedIndex
) -> torch.Tensor:
    """`paged_attention` for the whole step at once (equal up to summation order): q [T, Hq, D]
    gathered into [B, N] rows, each request's context into [B, C], one masked SDPA."""
    qb = q[index.query_rows].transpose(1, 2)  # [B, Hq, N, D]
    kb = k_cache[index.context_slots].transpose(1, 2)  # [B, Hkv, C, D]
    vb = v_cache[index.context_slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=index.mask, enable_gqa=True)
    b, h, n, d = out.shape
    return out.transpose(1, 2).reshape(b * n, h, d).index_select(0, index.valid_rows)


def dense_causal_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
) -> torch.Tensor:
    """q: [B, L, Hq, D] at positions start..start+L-1; caches: [B, S, Hkv, D] filled to
    start + L. Every row of the batch has the same positions (code-predictor frames).

    From position 0 the causal mask is the top-left one `is_causal` names, and saying so
    lets torch pick a fused kernel (flash attention on CUDA) instead of building the mask:
    with an explicit mask and grouped heads CUDA takes torch's fp32 math path, ~10 kernels
    per layer for the predictor's two-token first pass (on CUDA the predictor now runs its
    own fused kernel there, `kernels.frame_attention.frame_pass`)."""
    length = q.shape[1]
    ctx = start + length
    qb = q.transpose(1, 2)
    kb = k_cache[:, :ctx].transpose(1, 2)
    vb = v_cache[:, :ctx].transpose(1, 2)
    if start == 0 and length > 1:
        out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2)
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
    meta: DecodeAttentionMetadata,
) -> torch.Tensor:
    """q: [B, Hq, D], one token per request. Batched: one gather and one SDPA for the whole
    batch (the per-request loop costs a few launches per request per layer); padded keys are
    masked out and the result equals `paged_attention` up to summation order. Not batched:
    exactly `paged_attention`'s per-request computation."""
    if not meta.batched:
        out = torch.empty_like(q)
        for b, ctx in enumerate(meta.seq_lens):
            out[b : b + 1] = _attend_request(
                q[b : b + 1], k_cache, v_cache, meta.gather_slots[b, :ctx]
            )
        return out
    b, hq, d = q.shape
    k = k_cache[meta.gather_slots].transpose(1, 2)  # [B, Hkv, L, D]
    v = v_cache[meta.gather_slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q.view(b, 1, hq, d).transpose(1, 2),
        k,
        v,
        attn_mask=meta.gather_mask[:, None, None, :],
        enable_gqa=True,
    )
    return out.transpose(1, 2).reshape(b, hq, d)
