"""GPU: a single step's audio queued before its frames are read back (`StepOps.audio_ahead`,
`StreamSlots.queue_ahead`, pytest -m cuda).

The tiny fused pipeline on CUDA with graphs: the PCM equals that of the audio queued after
the read (bit for bit with single steps, where both runs make the same decoder passes; the
requests ignore the stop token), and queueing it on the side stream neither syncs the host
nor waits for the main stream's later work. The ordering is tested on the CPU
(tests/stages/test_audio_ahead.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.factories import Collector, build, speech

pytestmark = pytest.mark.cuda

SINGLE = "pipeline.stages.talker.window_k=0"


def pcm(*overrides: str, ahead: bool) -> np.ndarray:
    orch = build("qwen3_tts_fused", "platform=cuda", *overrides, start=False)
    try:
        ops = orch.engines[0].runner.ops
        if not ahead:  # the audio after the read, as held frames have it
            ops.audio_ahead = lambda reqs, queued: None
        sinks = [Collector() for _ in range(3)]
        for i, (sink, n) in enumerate(zip(sinks, (21, 14, 9), strict=True)):
            orch.submit(speech(f"r{i}", seed=i, max_new_tokens=n, ignore_eos=True), sink)
        orch.start()
        return np.concatenate([s.wait().pcm for s in sinks])
    finally:
        orch.stop()


def test_single_steps_audio_ahead_is_the_audio_after_the_read_bit_for_bit():
    """Without windows the steps are the same in both runs, and so is every decoder pass."""
    after, ahead = pcm(SINGLE, ahead=False), pcm(SINGLE, ahead=True)
    assert after.shape == ahead.shape == ((21 + 14 + 9) * 1920,)
    assert float(np.sqrt(np.mean(after**2))) > 1e-3
    np.testing.assert_array_equal(ahead, after)


def test_with_windows_on_the_side_stream_the_pcm_is_the_same_within_rounding():
    """Windows are sized by the playback clock, which reads the wall clock: the two runs may
    split a request's frames into other decoder passes, which round differently
    (tests/cuda/test_window_audio_cuda.py)."""
    after, ahead = pcm(ahead=False), pcm(ahead=True)
    assert after.shape == ahead.shape == ((21 + 14 + 9) * 1920,)
    rms = float(np.sqrt(np.mean(after**2)))
    err = float(np.sqrt(np.mean((ahead - after) ** 2)))
    print(f"ahead vs after the read, 8-step windows: error rms {err:.3e} of rms {rms:.3e}")
    assert rms > 1e-3 and err < 1e-2 * rms


def test_audio_ahead_on_the_side_stream_waits_for_nothing_but_its_codes():
    """Queued behind the step's `made` event only: its PCM is ready while a long kernel
    queued after that event still runs on the main stream, and nothing syncs the host."""
    orch = build("qwen3_tts_fused", "platform=cuda")  # 8-step windows: a side stream
    try:
        slots = orch.engines[0].runner.model.slots
        assert slots.side is not None
        main = torch.cuda.current_stream()
        full = torch.zeros(2, 16, dtype=torch.int64, device="cuda")
        full[1, 0] = 2150  # a row that drew the stop token: clamped, decoded, dropped later
        slots.queue_ahead(("x", "y"), full, None).result()  # the slots taken, first frames
        torch.cuda.synchronize()
        made = torch.cuda.Event()
        made.record(main)
        torch.cuda._sleep(2_000_000_000)  # ~1 s of spinning on the main stream, after `made`
        busy = torch.cuda.Event()
        busy.record(main)
        torch.cuda.set_sync_debug_mode("error")
        try:
            pending = slots.queue_ahead(("x", "y"), full, made)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        got = pending.result()
        assert not busy.query()  # the main stream's kernel still runs: nothing waited for it
        assert [got[r].shape for r in ("x", "y")] == [(1920,), (1920,)]
        assert np.isfinite(got["x"]).all()
        torch.cuda.synchronize()
        slots.finish("x")
        slots.finish("y")
    finally:
        orch.stop()
