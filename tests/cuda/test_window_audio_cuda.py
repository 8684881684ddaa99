"""GPU: a window's frames decoded in one replay of the window decoder graph (pytest -m cuda).

The tiny model on CUDA with graphs on: window_k=8 gives the K=0 codes and, within the
decoder's rounding, the K=0 PCM: the decoder runs in CUDA's default float16 (in float32,
cuDNN's convolutions round to TF32), and one pass over 8 frames picks other kernels than
eight one-frame passes (so the two differ by ~1e-3 of the signal, where on the CPU in
float32 they agree to one 16-bit step); and the talker decodes audio once per window."""

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
    plain = pcm("pipeline.stages.talker.window_k=0")  # CUDA's default is 8-step windows
    counter = AudioCalls()
    windowed = pcm("pipeline.stages.talker.window_k=8", counter=counter)
    assert plain.shape == windowed.shape == (3, 33 * 1920)
    rms = float(np.sqrt(np.mean(plain**2)))
    err = float(np.sqrt(np.mean((windowed - plain) ** 2)))
    worst = float(np.abs(windowed - plain).max())
    print(f"window vs single-step PCM: rms {rms:.3e}, error rms {err:.3e}, max {worst:.3e}")
    assert rms > 1e-3 and err < 1e-2 * rms and worst < 0.05 * float(np.abs(plain).max())
    # 33 frames: 1 from the prefill, then 4 windows of 8 (requests arriving together share
    # them); far fewer decoder calls than the 33 steps a request takes
    assert counter.calls <= 12
