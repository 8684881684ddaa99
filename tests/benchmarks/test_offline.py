"""The offline benchmark drives a built pipeline through its public surface only."""

from __future__ import annotations

import pytest

from benchmarks.offline import measure


@pytest.mark.parametrize("pipeline", ["qwen3_tts_fused", "qwen3_tts"])
def test_measure_gets_exact_lengths_from_every_request(pipeline):
    r = measure("qwen3_tts_tiny", "cpu", pipeline, concurrency=2, frames=3)
    assert r["errors"] == [] and r["samples_ok"] is True
    assert set(r["window_k"].values()) == {0}  # recorded, resolved: no windows on the CPU
    assert r["concurrency"] == 2 and r["rtf_median"] > 0 and r["audio_throughput"] > 0
