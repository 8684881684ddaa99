"""GPU: a request that arrives while another decodes makes mixed steps, whose decoding rows
replay the decode graph (pytest -m cuda). The running request's audio equals its audio alone
(within the decoder's rounding in its buckets, float16 on CUDA by default; a different code
would change it wholesale)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.factories import Collector, FirstAudio, build, speech

pytestmark = pytest.mark.cuda


def test_a_request_arriving_mid_stream_leaves_the_running_one_unchanged():
    # single steps (CUDA's default is 8-step windows): a window would not take the arrival
    orch = build("qwen3_tts_fused", "platform=cuda", "pipeline.stages.talker.window_k=0")
    try:
        alone = Collector()
        orch.submit(speech("a0", seed=5, max_new_tokens=30, ignore_eos=True), alone)
        want = alone.wait().pcm
        a, b = FirstAudio(), Collector()
        orch.submit(speech("a1", seed=5, max_new_tokens=30, ignore_eos=True), a)
        assert a.started.wait(60)
        orch.submit(speech("b", text="A second request.", seed=6, max_new_tokens=10), b)
        got = a.wait().pcm
        assert b.wait().terminal.error is None and len(b.pcm) > 0
    finally:
        orch.stop()
    assert got.shape == want.shape == (30 * 1920,)
    rms = float(np.sqrt(np.mean(want**2)))
    err = float(np.sqrt(np.mean((got - want) ** 2)))
    print(f"mid-stream arrival: rms {rms:.3e}, error rms {err:.3e}")
    assert rms > 1e-3 and err < 1e-2 * rms
