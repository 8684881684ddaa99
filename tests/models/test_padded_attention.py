"""A mixed step as one padded SDPA (`PaddedIndex`, what CUDA uses) equals the request-by-request
reference `paged_attention`: fresh prompts, a chunk continuing a cached prefix, decode rows,
all in one step with shuffled blocks."""

from __future__ import annotations

import pytest
import torch

from omniflow.models.layers.attention import (
    PaddedIndex,
    PagedAttentionMetadata,
    padded_attention,
    paged_attention,
)

BS, HQ, HKV, D = 4, 4, 2, 8


def layout(plan: list[tuple[int, int]], seed: int):
    """plan: (new tokens, context length after the step) per request -> q, caches, metas."""
    g = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-ctx // BS) for _, ctx in plan]
    perm = torch.randperm(sum(blocks_needed) + 3, generator=g).tolist()
    contexts, starts, at = [], [0], 0
    for n, ctx in plan:
        nb = -(-ctx // BS)
        ids = perm[at : at + nb]
        at += nb
        contexts.append([ids[p // BS] * BS + p % BS for p in range(ctx)])
        starts.append(starts[-1] + n)
    slots = (len(perm) + 1) * BS
    k_cache = torch.randn(slots, HKV, D, generator=g)
    v_cache = torch.randn(slots, HKV, D, generator=g)
    q = torch.randn(starts[-1], HQ, D, generator=g)
    seq_lens = tuple(ctx for _, ctx in plan)
    slot_mapping = torch.tensor(
        [c[p] for (n, ctx), c in zip(plan, contexts, strict=True) for p in range(ctx - n, ctx)]
    )
    ref = PagedAttentionMetadata(
        slot_mapping, tuple(starts), seq_lens, tuple(torch.tensor(c) for c in contexts)
    )
    padded = PaddedIndex.from_lengths(tuple(starts), seq_lens, contexts, torch.device("cpu"))
    fast = PagedAttentionMetadata(slot_mapping, tuple(starts), seq_lens, (), padded)
    return q, k_cache, v_cache, ref, fast


def test_padded_step_equals_request_by_request():
    plans = [
        [(7, 7), (3, 3), (1, 1)],  # fresh prompts of different lengths
        [(5, 12), (1, 30), (9, 9), (1, 2)],  # a chunk after a cached prefix, decodes, a prompt
        [(1, 17)],  # one decode row
    ]
    for seed, plan in enumerate(plans):
        q, kc, vc, ref, fast = layout(plan, seed)
        want = paged_attention(q, kc, vc, ref)
        got = fast.attend(q, kc, vc)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_mask_is_causal_within_the_context_and_ignores_padding():
    index = PaddedIndex.from_lengths(
        (0, 2, 3), (5, 1), [[10, 11, 12, 13, 14], [7]], torch.device("cpu")
    )
    # request 0: 2 queries at positions 3 and 4 of 5; request 1: 1 query at position 0 of 1
    assert index.mask[0, 0].tolist() == [[True] * 4 + [False], [True] * 5]
    assert index.mask[1, 0].tolist() == [[True, False, False, False, False], [False] * 5]
    assert index.valid_rows.tolist() == [0, 1, 2]  # rows [0, 1] of request 0, [0] of 1
    assert index.query_rows.tolist() == [[0, 1], [2, 0]]
    assert index.context_slots.tolist() == [[10, 11, 12, 13, 14], [7, 0, 0, 0, 0]]


@pytest.mark.cuda
def test_padded_attention_never_reads_the_device_back():
    """Every layer of an eager prefill attends this way: a host read here (a boolean-mask
    un-padding did one per layer) stalls the launches of every layer after it."""
    q, kc, vc, ref, fast = layout([(5, 12), (1, 30), (9, 9)], 0)
    dev = torch.device("cuda")
    contexts = [c.tolist() for c in ref.context_slots]
    index = PaddedIndex.from_lengths(fast.query_starts, fast.seq_lens, contexts, dev)
    q, kc, vc = q.to(dev), kc.to(dev), vc.to(dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = padded_attention(q, kc, vc, index)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = padded_attention(q.cpu(), kc.cpu(), vc.cpu(), fast.padded)
    torch.testing.assert_close(out.cpu(), want, atol=1e-5, rtol=1e-5)
