"""The prompt path (`prompt_graph.PromptGraphs`, run eagerly here; CUDA captures the same
step): a prefill whose requests each compute their whole context, padded to a token bucket
and attended through a per-token segment mask, equals `Talker.forward` — hidden states and
the K/V it writes — and leaves every other cache slot alone; steps it cannot serve (a cached
prefix, too many tokens) are declined and run eagerly."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omniflow.models.qwen3_tts.prompt_graph import (
    PromptGraphs,
    covers_whole_contexts,
    pack_requests,
)
from omniflow.worker.inputs import build_prefill
from tests.stages.test_runner_paths import decoding_runner


def whole_prompts(runner, reqs, batched: bool):
    order = [(dataclasses.replace(r, num_computed=0), r.prompt_len) for r in reqs]
    return build_prefill(runner.model, order, runner.block_size, runner.device, batched)


def graphs(runner, max_tokens: int) -> PromptGraphs:
    kv = runner.model.kv
    return PromptGraphs(
        runner.model.talker,
        runner.kv_caches,
        max_tokens=max_tokens,
        max_positions=kv.max_blocks * kv.block_size,
        dummy_slot=kv.dummy_slot,
        capture=False,
    )


def snapshot(kv_caches) -> list[torch.Tensor]:
    return [c.clone() for pair in kv_caches for c in pair]


def test_whole_prompts_equal_the_eager_forward_and_write_only_their_slots():
    _, runner, reqs = decoding_runner()
    model = runner.model
    for batched in (False, True):  # per-request and padded eager metadata
        batch = whole_prompts(runner, reqs, batched)
        assert covers_whole_contexts(batch.meta)
        embeds = model.embed_prefill(batch.inputs)
        before = snapshot(runner.kv_caches)
        want = model.talker.forward(embeds, batch.positions, batch.meta, runner.kv_caches)
        eager_kv = snapshot(runner.kv_caches)
        for c, c0 in zip((c for p in runner.kv_caches for c in p), before, strict=True):
            c.copy_(c0)  # the caches as they were
        prompt = graphs(runner, 256)
        got = prompt.run(embeds, batch.positions, batch.meta)
        assert got is not None and got.shape == want.shape
        assert prompt.bucket_for(embeds.shape[0]) > embeds.shape[0]  # padding rows ran too
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        dummy = runner.model.kv.dummy_slot
        for c, e in zip((c for p in runner.kv_caches for c in p), eager_kv, strict=True):
            torch.testing.assert_close(c[:dummy], e[:dummy], atol=2e-5, rtol=2e-5)


def test_a_step_above_the_largest_bucket_runs_as_replays_of_whole_requests():
    """74 tokens (prompts of 22, 39 and 13) with buckets up to 64: two replays, (22 + 39)
    and 13, whose concatenation equals the eager forward, K/V included."""
    _, runner, reqs = decoding_runner()
    model = runner.model
    batch = whole_prompts(runner, reqs, True)
    assert batch.meta.query_starts == (0, 22, 61, 74)
    embeds = model.embed_prefill(batch.inputs)
    before = snapshot(runner.kv_caches)
    want = model.talker.forward(embeds, batch.positions, batch.meta, runner.kv_caches)
    eager_kv = snapshot(runner.kv_caches)
    for c, c0 in zip((c for p in runner.kv_caches for c in p), before, strict=True):
        c.copy_(c0)
    prompt = graphs(runner, 64)
    got = prompt.run(embeds, batch.positions, batch.meta)
    assert got is not None and got.shape == want.shape
    assert (prompt.served, prompt.replays) == (1, 2)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    dummy = runner.model.kv.dummy_slot
    for c, e in zip((c for p in runner.kv_caches for c in p), eager_kv, strict=True):
        torch.testing.assert_close(c[:dummy], e[:dummy], atol=2e-5, rtol=2e-5)


def test_requests_are_packed_in_order_into_groups_within_the_bucket():
    assert pack_requests((0, 22, 61, 74), 64) == [(0, 61), (61, 74)]
    assert pack_requests((0, 22, 61, 74), 48) == [(0, 22), (22, 61), (61, 74)]
    assert pack_requests((0, 22, 61, 74), 74) == [(0, 74)]
    assert pack_requests((0, 32, 64), 32) == [(0, 32), (32, 64)]  # exactly full groups
    assert pack_requests((0, 22, 61, 74), 38) is None  # the 39-token request fits no bucket
    assert pack_requests((0, 5), 16) == [(0, 5)]


def test_prompts_of_different_lengths_do_not_attend_to_each_other():
    """Each request's hidden states equal that request prefilled alone."""
    _, runner, reqs = decoding_runner()
    model = runner.model
    prompt = graphs(runner, 256)
    batch = whole_prompts(runner, reqs, True)
    together = prompt.run(model.embed_prefill(batch.inputs), batch.positions, batch.meta)
    starts = batch.meta.query_starts
    for i, r in enumerate(reqs):
        alone = whole_prompts(runner, [r], True)
        got = prompt.run(model.embed_prefill(alone.inputs), alone.positions, alone.meta)
        torch.testing.assert_close(together[starts[i] : starts[i + 1]], got, atol=2e-5, rtol=2e-5)


def test_a_cached_prefix_or_too_many_tokens_is_declined():
    _, runner, reqs = decoding_runner()
    model = runner.model
    tail = [(dataclasses.replace(r, num_computed=r.num_computed - 3), 3) for r in reqs]
    chunk = build_prefill(model, tail, runner.block_size, runner.device, True)
    assert not covers_whole_contexts(chunk.meta)
    embeds = model.embed_prefill(chunk.inputs)
    assert graphs(runner, 256).run(embeds, chunk.positions, chunk.meta) is None
    batch = whole_prompts(runner, reqs, True)
    t = batch.positions.shape[0]
    small = graphs(runner, 16)
    assert (
        t > 16 and small.run(model.embed_prefill(batch.inputs), batch.positions, batch.meta) is None
    )


def test_the_key_puts_a_pipelines_prefills_on_the_prompt_path_with_the_same_audio():
    """`pipeline.stages.<ar stage>.prompt_graph_tokens` acts: the built talker prefills its
    prompts on the prompt path (run eagerly on the CPU), and the seeded audio is what the
    eager prefill gives."""
    from tests.factories import Collector, build, speech

    def serve(*overrides: str):
        orch = build("qwen3_tts_fused", *overrides)
        try:
            sinks = {}
            for rid, text in (("a", "Hello there."), ("b", "A longer sentence, to differ.")):
                sinks[rid] = Collector()
                req = speech(rid, text=text, seed=7, max_new_tokens=6, ignore_eos=True)
                orch.submit(req, sinks[rid])
            pcm = {rid: s.wait().pcm for rid, s in sinks.items()}
            return pcm, orch.engines[0].runner.model.prompt_graphs
        finally:
            orch.stop()

    eager, none = serve()
    assert none is None
    # 48: each prompt fits, the two together do not: prefilled in one step (as they usually
    # are), that step runs as two replays (the model-level test above pins that down)
    for tokens in (256, 48):
        graphed, prompt = serve(f"pipeline.stages.talker.prompt_graph_tokens={tokens}")
        assert prompt is not None and prompt.served >= 1
        for rid in eager:
            assert graphed[rid].shape == eager[rid].shape == (6 * 1920,)
            torch.testing.assert_close(graphed[rid], eager[rid], atol=1e-4, rtol=1e-4)


def changed_slots(before: list[torch.Tensor], kv_caches) -> set[int]:
    after = [c for pair in kv_caches for c in pair]
    rows: set[int] = set()
    for b, a in zip(before, after, strict=True):
        rows |= set((b != a).flatten(1).any(1).nonzero().flatten().tolist())
    return rows


def test_a_smaller_prefill_after_a_larger_one_writes_only_its_own_slots():
    """The shared buffers keep the larger step's rows past the smaller one's tokens: they
    must become padding (writing `dummy_slot` only), not rewrite the earlier step's slots."""
    _, runner, reqs = decoding_runner()
    model = runner.model
    prompt = graphs(runner, 256)
    big = whole_prompts(runner, reqs, True)
    prompt.run(model.embed_prefill(big.inputs), big.positions, big.meta)
    small = whole_prompts(runner, reqs[:1], True)
    for c in (c for pair in runner.kv_caches for c in pair):
        c.normal_()  # every slot differs from what a rewrite would put there
    before = snapshot(runner.kv_caches)
    prompt.run(model.embed_prefill(small.inputs), small.positions, small.meta)
    mine = set(small.meta.slot_mapping.tolist())
    assert prompt.bucket_for(small.positions.shape[0]) < prompt.bucket_for(big.positions.shape[0])
    assert mine < changed_slots(before, runner.kv_caches) <= mine | {runner.model.kv.dummy_slot}


def test_the_prompt_step_reads_nothing_back_to_the_host():
    """The CPU stand-in for a capture (the segment ids and mask come from the positions on
    the device)."""
    from tests.models.test_predictor_graph import HostReads

    _, runner, reqs = decoding_runner()
    model = runner.model
    prompt = graphs(runner, 256)
    batch = whole_prompts(runner, reqs, True)
    embeds = model.embed_prefill(batch.inputs)
    with HostReads() as mode:
        prompt.run(embeds, batch.positions, batch.meta)
    assert mode.seen == []


def test_a_bucket_above_the_step_token_budget_is_refused_naming_the_key():
    from omniflow.config.compose import compose
    from omniflow.config.resolve import build_graph
    from omniflow.errors import ConfigError

    key = "pipeline.stages.talker.prompt_graph_tokens"
    budget = "pipeline.stages.talker.scheduler.max_num_batched_tokens"
    with pytest.raises(ConfigError) as exc:
        build_graph(compose(["platform=cpu", f"{key}=1024", f"{budget}=512"]))
    assert exc.value.key == key and "512" in str(exc.value)
    graph = build_graph(compose(["platform=cpu", f"{key}=512", f"{budget}=512"]))
    assert graph.stages["talker"].prompt_graph_tokens == 512


def test_null_resolves_to_512_with_cuda_graphs_capped_by_the_budget_and_0_without():
    """The shipped pipelines leave the key null: the production path (`platform=cuda`) gets
    prompt graphs without an override, the CPU and the eager debugging path keep the eager
    prefill, and an explicit value is kept as given."""
    from omniflow.config.compose import compose
    from omniflow.config.resolve import build_graph

    key = "pipeline.stages.talker.prompt_graph_tokens"
    budget = "pipeline.stages.talker.scheduler.max_num_batched_tokens"

    def tokens(*overrides: str, pipeline: str = "qwen3_tts_fused") -> int:
        graph = build_graph(compose([f"pipeline={pipeline}", *overrides]))
        return graph.stages["talker"].prompt_graph_tokens

    assert tokens("platform=cuda") == 512
    assert tokens("platform=cuda", pipeline="qwen3_tts") == 512
    assert tokens("platform=cuda", f"{budget}=256") == 256
    assert tokens("platform=cuda", "platform.cuda_graphs=false") == 0
    assert tokens("platform=cpu") == 0
    assert tokens("platform=cpu", f"{key}=64") == 64
    assert tokens("platform=cuda", f"{key}=0") == 0


def test_recompute_after_preemption_through_the_prompt_path_gives_the_same_codes():
    """A preempted request's recompute covers its whole context (prompt and output frames) in
    one step, so it qualifies: its codes still equal the unpreempted run's."""
    from tests.stages.test_talker_engine import generate, preemptible

    reqs = [preemptible(f"r{i}", seed=i) for i in range(3)]
    calm, _, _ = generate(reqs)
    squeeze = dict(num_kv_blocks=12, block_size=4, max_model_len=48, max_num_batched_tokens=256)
    squeezed, _, engine = generate(reqs, prompt_graph_tokens=64, **squeeze)
    prompt = engine.runner.model.prompt_graphs
    assert engine.scheduler.num_preemptions > 0
    # one step prefills the three prompts; every later prefill is a recompute
    assert prompt is not None and prompt.served >= 2
    assert squeezed == calm


def test_a_kv_layout_that_does_not_fit_the_talker_is_refused():
    _, runner, _ = decoding_runner()
    kv = runner.model.kv
    talker = runner.model.talker
    with pytest.raises(ValueError, match="KV caches for"):
        PromptGraphs(talker, runner.kv_caches[:-1], 64, 512, kv.dummy_slot, capture=False)
    slots = runner.kv_caches[0][0].shape[0]
    with pytest.raises(ValueError, match="outside the"):
        PromptGraphs(talker, runner.kv_caches, 64, 512, slots, capture=False)
