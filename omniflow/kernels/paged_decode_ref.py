"""The torch reference for `paged_decode.paged_decode_attention`: the test oracle.

One request at a time, fp32 throughout, reading block tables and lengths on the host. Slow
and not graph-safe on purpose: it is meant to be obviously right, not fast.
"""

from __future__ import annotations

import torch
from torch import Tensor

from omniflow.kernels.args import PagedContext


def paged_decode_attention_ref(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, context: PagedContext, scale: float | None = None
) -> Tensor:
    """q: [B, Hq, D]; caches: [slots, Hkv, D] with this step's K/V already written; `context`:
    block_tables [B, max_blocks], context_lens [B] (0: an inert row, its output is 0).
    Query head h attends with kv head h // (Hq // Hkv)."""
    tables, lens, block_size = context.block_tables, context.context_lens, context.block_size
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    scale = d**-0.5 if scale is None else scale
    out = torch.empty_like(q)
    for row in range(b):
        n = int(lens[row])
        if n == 0:
            out[row] = 0
            continue
        num_blocks = -(-n // block_size)
        blocks = tables[row, :num_blocks].long()
        offsets = torch.arange(block_size, device=blocks.device)
        slots = (blocks[:, None] * block_size + offsets).flatten()[:n]
        k = k_cache[slots].float().repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v_cache[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[row].float(), k) * scale
        probs = torch.softmax(scores, dim=-1)
        out[row] = torch.einsum("hn,nhd->hd", probs, v).to(out.dtype)
    return out
