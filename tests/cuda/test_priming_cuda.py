"""GPU: reference priming (`ref_context_frames`, voice clone) on CUDA with graphs on, for the
tiny Base preset (pytest -m cuda). Primed slots are filled eagerly and then decoded by the
recorded per-frame (or window) step, so this checks that the graphs read the primed state.

Fused vs two-stage agree within the decoder's rounding (CUDA's default float16, or TF32 in
float32's convolutions; the two pipelines decode different frame counts per pass); on the CPU
in float32 they agree within one 16-bit step (tests/stages/test_reference_priming_pipeline.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.factories import Collector, build
from tests.stages.test_reference_priming_pipeline import BASE, clone

pytestmark = pytest.mark.cuda


def pcm(pipeline: str, *overrides: str) -> np.ndarray:
    orch = build(pipeline, "platform=cuda", BASE, *overrides)
    try:
        c = Collector()
        orch.submit(clone("r", frames=12), c)
        assert c.wait(120).terminal.error is None
        return c.pcm
    finally:
        orch.stop()


def close(a: np.ndarray, b: np.ndarray) -> bool:
    rms = float(np.sqrt(np.mean(b**2)))
    return rms > 1e-3 and float(np.sqrt(np.mean((a - b) ** 2))) < 1e-2 * rms


def test_priming_acts_on_cuda_and_the_pipelines_agree():
    single = "pipeline.stages.talker.window_k=0"  # CUDA's default is 8-step windows
    unset = pcm("qwen3_tts_fused", single)
    none = pcm("qwen3_tts_fused", single, "pipeline.stages.talker.ref_context_frames=0")
    windowed = pcm("qwen3_tts_fused", "pipeline.stages.talker.window_k=4")
    staged = pcm("qwen3_tts")
    assert unset.shape == none.shape == staged.shape == (12 * 1920,)
    assert not close(none, unset)  # the reference context changes the audio
    assert close(staged, unset) and close(windowed, unset)
