"""The batched decode attention equals the per-request reference."""

from __future__ import annotations

import torch

from omniflow.models.layers.attention import (
    DecodeAttentionMetadata,
    PagedAttentionMetadata,
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
    from omniflow.models.qwen3_tts.ar_model import build_ar_model
    from omniflow.sched.ar import ARScheduler
    from omniflow.stages.engine import StageEngine
    from omniflow.stages.runner import ARModelRunner
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
