"""`model.codec_dtype` sets the streaming decoder's dtype in both pipelines (fp32 by default).

Below float32 the two pipelines are not bitwise equal: the fused talker decodes a frame per
step, the two-stage code2wav a chunk at a time, and a reduced dtype rounds a chunk boundary's
carried sums differently. Each stays within the stated bound of float32's PCM
(tests/codec_bound.py), and so does one against the other.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.codec_bound import DTYPES, assert_within_bound
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


@pytest.fixture(scope="module")
def fp32_fused() -> np.ndarray:
    fused, two = synth("qwen3_tts_fused"), synth("qwen3_tts")
    np.testing.assert_allclose(fused, two, atol=1 / 32768)  # fp32: one decode, two pipelines
    return fused


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduced_codec_dtype_stays_within_the_bound(fp32_fused, dtype):
    name = str(dtype).removeprefix("torch.")
    fused = synth("qwen3_tts_fused", f"model.codec_dtype={name}")
    two = synth("qwen3_tts", f"model.codec_dtype={name}")
    assert fused.dtype == two.dtype == np.float32  # PCM leaves as float32
    assert len(fused) == len(two) == len(fp32_fused) == 6 * 1920
    want = torch.from_numpy(fp32_fused)
    for pcm in (fused, two):  # the same codes (the talker is untouched), decoded in `dtype`
        assert assert_within_bound(want, torch.from_numpy(pcm), dtype).max_abs > 1e-4
    assert_within_bound(torch.from_numpy(two), torch.from_numpy(fused), dtype)


def streaming_decoder_of(orch):
    """The `StreamingDecoder` of the stage that decodes (fused: the talker's model's)."""
    last = orch.engines[-1].runner
    return last.model.slots.decoder if hasattr(last, "model") else last.decoder


@pytest.mark.parametrize("pipeline", ["qwen3_tts_fused", "qwen3_tts"])
def test_a_float16_decoder_that_overflows_ends_that_request_alone_with_one_clear_error(
    monkeypatch, pipeline
):
    """float16's range (65,504) is the risk float32 does not have: the request whose PCM is
    not finite ends with one error naming the key that avoids it, instead of streaming NaN;
    the requests decoded beside it keep their audio, and the stage goes on serving."""
    orch = build(pipeline, "model.codec_dtype=float16", start=False)
    try:
        streaming = streaming_decoder_of(orch)
        real, real_step = streaming.decode, streaming.decode_step
        made: dict[int, int] = {}
        beside: list[list[int]] = []  # the slots of each call that overflowed

        def overflow(slots, frames, pcm):  # the first slot handed out (the first request's)
            for i, slot in enumerate(slots):  # overflows from its third frame on
                made[slot] = made.get(slot, 0) + frames[i]
                if slot == 0 and made[slot] > 2:
                    pcm[i] = pcm[i] * float("inf")
                    beside.append(list(slots))
            return pcm

        def overflowing(slots, codes):  # the eager decoder, from host codes
            return overflow(slots, [len(c) for c in codes], real(slots, codes))

        def overflowing_step(slot_ids, codes):  # from device codes (a step's, ahead)
            n = 1 if codes.dim() == 2 else codes.shape[1]
            slots = slot_ids.tolist()
            return overflow(slots, [n] * len(slots), real_step(slot_ids, codes))

        monkeypatch.setattr(streaming, "decode", overflowing)
        monkeypatch.setattr(streaming, "decode_step", overflowing_step)
        sinks = {rid: Collector() for rid in ("r", "s")}
        for rid, sink in sinks.items():  # before the start: both are seated in one step
            orch.submit(speech(rid, max_new_tokens=8, ignore_eos=True), sink)
        orch.start()
        error = sinks["r"].wait().terminal.error
        assert error is not None and "not finite" in error
        assert "model.codec_dtype=float32" in error
        assert sinks["s"].wait().terminal.error is None and len(sinks["s"].pcm) == 8 * 1920
        if pipeline == "qwen3_tts_fused":  # one talker step decodes both rows, always
            assert any(1 in slots for slots in beside)  # s was in a call that overflowed
        # (two-stage, code2wav batches the chunks that have arrived: under load it may take
        # r's before s's, so the call that overflows need not hold s)
        monkeypatch.setattr(streaming, "decode", real)
        monkeypatch.setattr(streaming, "decode_step", real_step)
        sink = Collector()
        orch.submit(speech("t", max_new_tokens=6, ignore_eos=True), sink)
        assert sink.wait().terminal.error is None and len(sink.pcm) == 6 * 1920
    finally:
        orch.stop()


def test_the_decoder_is_built_in_the_platforms_codec_dtype():
    """`platform.codec_dtype` (CUDA's float16 default) reaches the built decoder, not only
    the printed config; `model.codec_dtype` when set."""
    for overrides, want in (
        (["platform.codec_dtype=float16"], torch.float16),
        (["model.codec_dtype=bfloat16"], torch.bfloat16),
    ):
        orch = build("qwen3_tts_fused", *overrides)
        try:
            assert streaming_decoder_of(orch).dtype == want
        finally:
            orch.stop()
