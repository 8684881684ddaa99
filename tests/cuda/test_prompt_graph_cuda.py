"""GPU: whole-prompt prefills replay captured graphs per token bucket
(`pipeline.stages.<ar stage>.prompt_graph_tokens`), and the seeded audio equals the eager
prefill's within the rounding of a different attention layout (a different code would change
it wholesale)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.factories import Collector, build, speech

pytestmark = pytest.mark.cuda


def serve(*overrides: str):
    orch = build("qwen3_tts_fused", "platform=cuda", *overrides)
    try:
        sinks = {}
        texts = ("Hello there.", "A longer sentence, to differ.", "Hi.")
        for i, text in enumerate(texts):
            sinks[i] = Collector()
            orch.submit(speech(f"r{i}", text=text, seed=3 + i, max_new_tokens=12), sinks[i])
        pcm = {i: s.wait().pcm for i, s in sinks.items()}
        return pcm, orch.engines[0].runner.model.prompt_graphs
    finally:
        orch.stop()


def test_prompt_graphs_capture_and_give_the_eager_audio():
    eager, _ = serve()
    graphed, prompt = serve("pipeline.stages.talker.prompt_graph_tokens=256")
    assert prompt is not None and prompt.graphed and prompt.served >= 1
    assert set(prompt.graphs) == set(prompt.buckets)  # captured up front
    for i, want in eager.items():
        got = graphed[i]
        assert got.shape == want.shape and len(want) > 0
        rms = float(np.sqrt(np.mean(want**2)))
        err = float(np.sqrt(np.mean((got - want) ** 2)))
        assert rms > 1e-3 and err < 1e-2 * rms, (i, rms, err)
