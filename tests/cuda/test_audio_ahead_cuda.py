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

from omniflow.worker.step_audio import StepAudio
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


def test_audio_ahead_on_the_side_stream_waits_for_its_codes_and_nothing_else():
    """Queued behind the step's `made` event: codes written on the main stream behind a long
    kernel are the ones decoded, and a long kernel queued after `made` is not waited for;
    nothing syncs the host. Row y drew the stop token: clamped, decoded, its samples dropped
    (`StepAudio.silent`)."""
    orch = build("qwen3_tts_fused", "platform=cuda", start=False)  # 8-step windows: a side stream
    try:
        slots = orch.engines[0].runner.model.slots
        assert slots.side is not None
        main = torch.cuda.current_stream()
        zeros = torch.zeros(2, 16, dtype=torch.int64, device="cuda")
        for rows in (("x", "y"), ("p", "q")):  # two pairs of slots in the same state
            slots.queue_ahead(rows, zeros, None).result()
        fives = torch.full((2, 16), 5, dtype=torch.int64, device="cuda")
        fives[1, 0] = 2150
        torch.cuda.synchronize()
        want = audio(slots.queue_ahead(("p", "q"), fives, None), "q")["p"]

        late = zeros.clone()
        torch.cuda._sleep(200_000_000)  # the codes are written only after this kernel
        late.copy_(fives)
        made = torch.cuda.Event()
        made.record(main)
        torch.cuda._sleep(2_000_000_000)  # ~1 s of spinning on the main stream, after `made`
        busy = torch.cuda.Event()
        busy.record(main)
        torch.cuda.set_sync_debug_mode("error")
        try:
            pending = slots.queue_ahead(("x", "y"), late, made)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        got = audio(pending, "y")
        assert not busy.query()  # the main stream's kernel still runs: nothing waited for it
        assert list(got) == ["x"] and got["x"].shape == (1920,)
        np.testing.assert_array_equal(got["x"], want)  # the codes written behind the wait
        torch.cuda.synchronize()
        for rid in ("x", "y", "p", "q"):
            slots.finish(rid)
    finally:
        orch.stop()


def audio(pending, silent: str) -> dict[str, np.ndarray]:
    return StepAudio([pending], "talker", 0, frozenset({silent})).result()
