"""GPU: whole-prompt prefills replay captured graphs per token bucket
(`pipeline.stages.<ar stage>.prompt_graph_tokens`). A replay equals the same step run eagerly
on the same inputs (hidden states and K/V, bitwise: the same kernels); through a pipeline in
float32 the seeded audio equals the eager prefill's within the rounding of a different
attention layout (a different code would change it wholesale)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from omniflow.models.qwen3_tts.prompt_graph import PromptGraphs
from omniflow.platforms.base import prepare_device
from omniflow.worker.inputs import build_prefill
from tests.factories import Collector, build, speech, talker_engine

pytestmark = pytest.mark.cuda

DEV = torch.device("cuda")
BF16 = torch.bfloat16


@pytest.mark.parametrize("packed", [False, True])
def test_a_replay_equals_the_eager_step_on_the_same_inputs(packed):
    """packed: the largest bucket is the longest prompt, so the three prompts together take
    several replays of whole requests (a step above the largest bucket)."""
    prepare_device("cuda")
    engine, proc = talker_engine(max_num_seqs=4, num_kv_blocks=256, device=DEV, dtype=BF16)
    runner = engine.runner
    for i, text in enumerate(["Hello there.", "A longer sentence, to differ.", "Hi."]):
        engine.add_request(proc.make_request(speech(f"r{i}", text=text, max_new_tokens=8)))
    engine.step()
    reqs = [runner.requests[f"r{i}"] for i in range(3)]
    kv = runner.model.kv
    assert kv is not None

    longest = max(r.prompt_len for r in reqs)
    assert sum(r.prompt_len for r in reqs) > longest

    def make(capture: bool) -> PromptGraphs:
        return PromptGraphs(
            runner.model.talker,
            runner.kv_caches,
            max_tokens=longest if packed else 128,
            max_positions=kv.max_blocks * kv.block_size,
            dummy_slot=kv.dummy_slot,
            capture=capture,
        )

    graphed, eager = make(True), make(False)
    graphed.capture_all()
    assert graphed.graphed and set(graphed.graphs) == set(graphed.buckets)
    for subset in (reqs, reqs[:1], reqs):  # a smaller bucket between two larger ones
        order = [(dataclasses.replace(r, num_computed=0), r.prompt_len) for r in subset]
        batch = build_prefill(runner.model, order, runner.block_size, DEV, True)
        embeds = runner.model.embed_prefill(batch.inputs)
        want = eager.run(embeds, batch.positions, batch.meta)
        want_kv = [c.clone() for pair in runner.kv_caches for c in pair]
        got = graphed.run(embeds, batch.positions, batch.meta)
        assert got is not None and want is not None and torch.equal(got, want)
        for c, w in zip((c for pair in runner.kv_caches for c in pair), want_kv, strict=True):
            assert torch.equal(c[: kv.dummy_slot], w[: kv.dummy_slot])
    assert graphed.served == 3 and (graphed.replays > 3) == packed


def serve(*overrides: str):
    orch = build("qwen3_tts_fused", "platform=cuda", "platform.dtype=float32", *overrides)
    try:
        sinks = {}
        texts = ("Hello there.", "A longer sentence, to differ.", "Hi.")
        for i, text in enumerate(texts):
            sinks[i] = Collector()
            req = speech(f"r{i}", text=text, seed=3 + i, max_new_tokens=12, ignore_eos=True)
            orch.submit(req, sinks[i])
        pcm = {i: s.wait().pcm for i, s in sinks.items()}
        return pcm, orch.engines[0].runner.model.prompt_graphs
    finally:
        orch.stop()


def test_prompt_graphs_in_a_pipeline_give_the_eager_audio():
    eager, none = serve("pipeline.stages.talker.prompt_graph_tokens=0")
    assert none is None
    graphed, prompt = serve("pipeline.stages.talker.prompt_graph_tokens=256")
    assert prompt is not None and prompt.graphed and prompt.served >= 1
    for i, want in eager.items():
        got = graphed[i]
        assert got.shape == want.shape == (12 * 1920,)
        rms = float(np.sqrt(np.mean(want**2)))
        err = float(np.sqrt(np.mean((got - want) ** 2)))
        assert rms > 1e-3 and err < 1e-2 * rms, (i, rms, err)


def test_the_cuda_platform_prefills_prompts_on_graphs_by_default():
    """`prompt_graph_tokens: null` in the shipped pipelines resolves to 512 on `platform=cuda`:
    the production path captures the prompt graphs and serves its prompts from them."""
    _, prompt = serve()
    assert prompt is not None and prompt.graphed and prompt.served >= 1
