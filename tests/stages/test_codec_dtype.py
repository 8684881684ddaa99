"""`model.codec_dtype` sets the streaming decoder's dtype in both pipelines (fp32 by default)."""

from __future__ import annotations

import numpy as np

from tests.factories import Collector, build, speech


def synth(pipeline: str, *overrides: str) -> np.ndarray:
    orch = build(pipeline, *overrides)
    try:
        sink = Collector()
        orch.submit(speech("r", max_new_tokens=6, ignore_eos=True), sink)
        assert sink.wait().terminal.error is None
        return sink.pcm
    finally:
        orch.stop()


def test_bfloat16_decoder_rounds_the_pcm_and_fp32_stays_exact():
    fp32_fused = synth("qwen3_tts_fused")
    fp32_two = synth("qwen3_tts")
    bf16_fused = synth("qwen3_tts_fused", "model.codec_dtype=bfloat16")
    bf16_two = synth("qwen3_tts", "model.codec_dtype=bfloat16")
    assert fp32_fused.dtype == bf16_fused.dtype == np.float32  # PCM leaves as float32
    assert len(bf16_fused) == len(fp32_fused) == 6 * 1920
    np.testing.assert_allclose(fp32_fused, fp32_two, atol=1 / 32768)
    # bf16 computes: not the fp32 samples, but close to them (the same codes decoded)
    for bf16 in (bf16_fused, bf16_two):
        err = np.abs(bf16 - fp32_fused)
        assert err.max() > 1e-4
        assert err.mean() < 0.1 * np.abs(fp32_fused).mean()
