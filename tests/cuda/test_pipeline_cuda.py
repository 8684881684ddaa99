"""Both pipelines on CUDA (tiny model): lengths exact, abort frees resources."""

from __future__ import annotations

import pytest

from tests.factories import Collector, build, speech

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("pipeline", ["qwen3_tts", "qwen3_tts_fused"])
def test_cuda_pipeline_lengths(pipeline):
    orch = build(pipeline, "platform=cuda")
    try:
        cs = []
        for i in range(4):
            c = Collector()
            orch.submit(speech(f"g{i}", max_new_tokens=10 + i, ignore_eos=True, seed=i), c)
            cs.append(c)
        for i, c in enumerate(cs):
            assert c.wait().pcm.shape == ((10 + i) * 1920,)
            assert c.terminal.error is None
    finally:
        orch.stop()
