"""GPU: held frames (`audio_pass_steps`) decoded several steps at a time on the decoder's
graphs, from codes selected on the device, give the PCM of one pass a step (pytest -m cuda).

The tiny fused model on CUDA with graphs, single steps (window_k=0), no playback clock so
that every cycle runs its 4 steps; requests of 21, 30 and 33 frames end inside cycles and at
their ends. As for windows (test_window_audio_cuda.py), a pass over several frames picks
other kernels than one-frame passes: the PCM agrees within the decoder's float16 rounding."""

from __future__ import annotations

import numpy as np
import pytest

from tests.factories import Collector, build, speech

pytestmark = pytest.mark.cuda

LENGTHS = (21, 30, 33)


def pcm(*overrides: str) -> list[np.ndarray]:
    orch = build(
        "qwen3_tts_fused",
        "platform=cuda",
        "pipeline.stages.talker.window_k=0",
        "pipeline.stages.talker.playback_margin_ms=null",
        *overrides,
    )
    try:
        sinks = [Collector() for _ in LENGTHS]
        for i, (n, sink) in enumerate(zip(LENGTHS, sinks, strict=True)):
            orch.submit(speech(f"r{i}", seed=i, max_new_tokens=n, ignore_eos=True), sink)
        return [s.wait().pcm for s in sinks]
    finally:
        orch.stop()


def test_held_frames_give_the_pcm_of_a_pass_a_step():
    plain = pcm()
    held = pcm("pipeline.stages.talker.audio_pass_steps=4")
    for n, a, b in zip(LENGTHS, plain, held, strict=True):
        assert a.shape == b.shape == (n * 1920,)
        rms = float(np.sqrt(np.mean(a**2)))
        err = float(np.sqrt(np.mean((b - a) ** 2)))
        print(f"{n} frames: rms {rms:.3e}, error rms {err:.3e}")
        assert rms > 1e-3 and err < 1e-2 * rms and np.abs(b - a).max() < 0.05 * np.abs(a).max()
