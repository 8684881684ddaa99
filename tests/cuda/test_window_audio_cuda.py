"""GPU: a window's frames decoded in one replay of the window decoder graph (pytest -m cuda).

The tiny model on CUDA with graphs on: window_k=8 gives the K=0 PCM within one 16-bit step
(one pass over 8 frames rounds differently from eight one-frame passes), and the talker
decodes audio once per window."""

from __future__ import annotations

import numpy as np
import pytest

from tests.factories import Collector, build, speech
from tests.stages.test_windows import AudioCalls

pytestmark = pytest.mark.cuda


def pcm(*overrides: str, counter: AudioCalls | None = None) -> np.ndarray:
    orch = build("qwen3_tts_fused", "platform=cuda", *overrides)
    if counter is not None:
        orch.set_phase_timer(counter)
    try:
        sinks = [Collector() for _ in range(3)]
        for i, sink in enumerate(sinks):
            orch.submit(speech(f"r{i}", seed=i, max_new_tokens=33, ignore_eos=True), sink)
        return np.stack([s.wait().pcm for s in sinks])
    finally:
        orch.stop()


def test_window_audio_equals_single_steps_and_is_decoded_once_per_window():
    plain = pcm()
    counter = AudioCalls()
    windowed = pcm("pipeline.stages.talker.window_k=8", counter=counter)
    assert plain.shape == windowed.shape == (3, 33 * 1920)
    np.testing.assert_allclose(windowed, plain, rtol=0, atol=1 / 32768)
    assert float(np.abs(plain).mean()) > 1e-3
    # 33 frames: 1 from the prefill, then 4 windows of 8 (requests arriving together share
    # them); far fewer decoder calls than the 33 steps a request takes
    assert counter.calls <= 12
