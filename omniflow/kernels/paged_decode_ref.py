"""The torch reference for `paged_decode.paged_decode_attention`: the test oracle.

One request at a time, fp32 throughout, reading block tables and lengths on the host. Slow
and not graph-safe on purpose: it is meant to be obviously right, not fast.
"""

from __future__ import annotations

import torch


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [B, Hq, D]; caches: [slots, Hkv, D] with this step's K/V already written;
    block_tables: [B, max_blocks]; context_lens: [B] (0: an inert row, its output is 0).
    Query head h attends with kv head h // (Hq // Hkv)."""
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    scale = d**-0.5 if scale is None else scale
    if out is None:
        out = torch.empty_like(q)
    for row in range(b):
        n = int(context_lens[row])
        if n == 0:
            out[row] = 0
            continue
        num_blocks = -(-n // block_size)
        blocks = block_tables[row, :num_blocks].long()
        offsets = torch.arange(block_size, device=blocks.device)
        slots = (blocks[:, None] * block_size + offsets).flatten()[:n]
        k = k_cache[slots].float().repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v_cache[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[row].float(), k) * scale
        probs = torch.softmax(scores, dim=-1)
        out[row] = torch.einsum("hn,nhd->hd", probs, v).to(out.dtype)
    return out
