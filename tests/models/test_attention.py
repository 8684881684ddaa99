"""The batched decode attention equals the per-request reference."""

from __future__ import annotations

import pytest
import torch

from omniflow.models.layers.attention import (
    DecodeAttentionMetadata,
    PagedAttentionMetadata,
    dense_causal_attention,
    paged_attention,
    paged_decode_attention,
)


def test_batched_decode_attention_matches_the_per_request_path():
    g = torch.Generator().manual_seed(0)
    slots, hkv, hq, d, bs = 256, 2, 4, 16, 4
    k_cache = torch.randn(slots, hkv, d, generator=g)
    v_cache = torch.randn(slots, hkv, d, generator=g)
    lens = [5, 17, 1, 30]
    perm = torch.randperm(slots // bs, generator=g)
    ctx, offset = [], 0
    tables = torch.zeros(len(lens), -(-max(lens) // bs), dtype=torch.int32)
    for i, n in enumerate(lens):
        blocks = perm[offset : offset + -(-n // bs)]
        offset += len(blocks)
        ctx.append((blocks[:, None] * bs + torch.arange(bs)).flatten()[:n])
        tables[i, : len(blocks)] = blocks
    q = torch.randn(len(lens), hq, d, generator=g)
    common = dict(
        slot_mapping=torch.tensor([c[-1] for c in ctx]),
        query_starts=tuple(range(len(lens) + 1)),
        seq_lens=tuple(lens),
    )
    ref = paged_attention(
        q, k_cache, v_cache, PagedAttentionMetadata(context_slots=tuple(ctx), **common)
    )
    fast = paged_decode_attention(
        q,
        k_cache,
        v_cache,
        DecodeAttentionMetadata.from_tables(
            common["slot_mapping"],
            tables,
            torch.tensor(lens, dtype=torch.int32),
            bs,
            tuple(lens),
            batched=True,
        ),
    )
    assert torch.allclose(fast, ref, atol=1e-5, rtol=0)


def test_engine_with_batched_decode_runs_to_the_right_lengths():
    from omniflow.config.schema import SchedulerConfig
    from omniflow.engine.stage_engine import StageEngine
    from omniflow.models.qwen3_tts.ar_model import build_ar_model
    from omniflow.sched.ar import ARScheduler
    from omniflow.worker.ar_runner import ARModelRunner
    from tests.factories import speech, talker_engine, tiny_bundle

    _, proc = talker_engine()
    cfg = SchedulerConfig(
        max_num_batched_tokens=256, max_model_len=512, block_size=4, num_kv_blocks=512
    )
    runner = ARModelRunner(
        build_ar_model(tiny_bundle()), cfg, torch.device("cpu"), torch.float32, batched_decode=True
    )
    fast_engine = StageEngine("talker", ARScheduler(cfg), runner)
    for i in range(3):
        fast_engine.add_request(
            proc.make_request(speech(f"r{i}", seed=i, max_new_tokens=10 + i, ignore_eos=True))
        )
    lengths = {}
    for o in fast_engine.run_until_idle():
        lengths[o.request_id] = lengths.get(o.request_id, 0) + len(o.tokens)
    assert lengths == {"r0": 10, "r1": 11, "r2": 12}


def _causal_by_hand(q, k_cache, v_cache, start):
    """Scores, mask, softmax and sum written out, grouped heads repeated: the oracle."""
    ctx = start + q.shape[1]
    group = q.shape[2] // k_cache.shape[2]
    k = k_cache[:, :ctx].repeat_interleave(group, dim=2)  # [B, ctx, Hq, D]
    v = v_cache[:, :ctx].repeat_interleave(group, dim=2)
    scores = torch.einsum("blhd,bshd->bhls", q, k) / q.shape[-1] ** 0.5
    qpos = torch.arange(start, ctx)[:, None]
    scores = scores.masked_fill(torch.arange(ctx)[None, :] > qpos, float("-inf"))
    return torch.einsum("bhls,bshd->blhd", scores.softmax(-1), v)


@pytest.mark.parametrize(("start", "length"), [(0, 2), (0, 5), (3, 1), (3, 4)])
def test_dense_causal_attention_is_causal_from_any_start(start, length):
    """From position 0 the function names the mask `is_causal` (flash attention on CUDA),
    later starts pass it: either way a query sees exactly the keys up to its own position
    (a non-causal first pass changes the earlier positions' outputs, which the predictor's
    next layer caches)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, length, 4, 8, generator=g)
    k_cache = torch.randn(3, 8, 2, 8, generator=g)
    v_cache = torch.randn(3, 8, 2, 8, generator=g)
    got = dense_causal_attention(q, k_cache, v_cache, start)
    want = _causal_by_hand(q, k_cache, v_cache, start)
    assert got.shape == (3, length, 4, 8)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
