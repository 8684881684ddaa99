"""GPU: a window's audio decoded in chunks on a stream of its own (`audio_chunk_frames`,
pytest -m cuda).

The tiny fused pipeline on CUDA with graphs, 8-step windows: with `audio_chunk_frames=4` the
PCM is the one-pass PCM within the decoder's rounding (tests/cuda/test_window_audio_cuda.py says why
passes over different frame counts differ there), every decoder pass runs on the side
stream, and queueing a chunk does not wait for the device (the window's later steps run
meanwhile)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omniflow.models.interface import FrameSample, QueuedFrames, SampledStep
from tests.factories import Collector, build, speech

pytestmark = pytest.mark.cuda

WINDOW = "pipeline.stages.talker.window_k=8"
CHUNKS = "pipeline.stages.talker.audio_chunk_frames=4"
MAIN = "pipeline.stages.talker.audio_chunk_frames=0"
"""One pass at the window's end on the main stream (null is the whole window on the side
stream on CUDA)."""


def pcm(*overrides: str) -> np.ndarray:
    orch = build("qwen3_tts_fused", "platform=cuda", WINDOW, *overrides)
    try:
        sinks = [Collector() for _ in range(3)]
        for i, (sink, n) in enumerate(zip(sinks, (33, 26, 19), strict=True)):
            orch.submit(speech(f"r{i}", seed=i, max_new_tokens=n, ignore_eos=True), sink)
        return np.concatenate([s.wait().pcm for s in sinks])
    finally:
        orch.stop()


def test_chunked_window_audio_equals_one_pass():
    whole, chunked = pcm(MAIN), pcm(CHUNKS)
    assert whole.shape == chunked.shape == ((33 + 26 + 19) * 1920,)
    rms = float(np.sqrt(np.mean(whole**2)))
    err = float(np.sqrt(np.mean((chunked - whole) ** 2)))
    print(f"chunked vs one-pass PCM: rms {rms:.3e}, error rms {err:.3e}")
    assert rms > 1e-3 and err < 1e-2 * rms


def test_a_chunk_is_queued_on_the_side_stream_without_waiting():
    """On the side stream, without a host sync, and not behind the main stream's later work:
    its codes are read on the device behind their steps' `made` event only, so its PCM is
    ready while a long kernel queued after that event still runs on the main stream."""
    orch = build("qwen3_tts_fused", "platform=cuda", WINDOW, CHUNKS)
    try:
        slots = orch.engines[0].runner.model.slots
        window = slots.passes.get(max(slots.passes, default=1))
        assert slots.side is not None and window is not None
        assert window.frames == 4
        assert window.capture_stream is slots.side  # its own cuBLAS workspace
        main = torch.cuda.current_stream()
        zeros = torch.zeros(1, 16, dtype=torch.int64, device="cuda")

        def step_made_now() -> SampledStep:
            made = torch.cuda.Event()
            made.record(main)
            return SampledStep(("x",), FrameSample((1,), ((0,) * 16,), zeros[:, 0], zeros, made))

        slots.queue([step_made_now()] * 4).result()  # the slot is taken, its first pass decoded
        torch.cuda.synchronize()
        windows = slots.device_windows
        step = step_made_now()
        torch.cuda._sleep(2_000_000_000)  # ~1 s of spinning on the main stream, after `made`
        busy = torch.cuda.Event()
        busy.record(main)
        torch.cuda.set_sync_debug_mode("error")
        try:
            pending = slots.queue([step] * 4)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        pcm = pending.result()["x"]
        assert not busy.query()  # the main stream's kernel still runs: nothing waited for it
        assert slots.device_windows == windows + 1  # its codes were read on the device
        assert pcm.shape == (4 * 1920,) and np.isfinite(pcm).all()
        torch.cuda.synchronize()
        slots.finish("x")
    finally:
        orch.stop()


def test_a_read_back_step_carries_the_event_behind_its_frames():
    """`read_frames` hands the side stream the read-back's event (`FrameSample.made`):
    without it the side stream would wait for the main stream's whole queue."""
    orch = build("qwen3_tts_fused", "platform=cuda", WINDOW, CHUNKS)
    try:
        model = orch.engines[0].runner.model
        full = torch.ones(2, 16, dtype=torch.int64, device="cuda")
        queued = QueuedFrames(full[:, 0], full, model.readback.start(full))
        sample = model.read_frames(queued)
        assert sample.made is not None and sample.made is queued.codes.copied
        assert sample.outputs == ((1,) * 16, (1,) * 16)
    finally:
        orch.stop()


@pytest.mark.parametrize(
    "chunks",
    [(MAIN,), (CHUNKS,), ("pipeline.stages.talker.audio_chunk_frames=8",)],
    ids=["one_pass", "chunks", "whole_window_on_the_side_stream"],
)
def test_async_scheduling_with_late_window_audio_gives_the_sync_pcm(chunks):
    """Under async scheduling a window's audio is waited for after the next window is queued
    (`worker/step_audio.py`): on the main stream behind it without chunks, beside it on the
    side stream with them. The PCM is the sync engine's (within the decoder's rounding: the batch
    composition of a decoder pass may differ between the two schedules). The ordering itself
    is tested on the CPU (tests/stages/test_late_audio.py)."""
    sync = pcm(*chunks, "pipeline.stages.talker.scheduler.async_scheduling=false")
    late = pcm(*chunks, "pipeline.stages.talker.scheduler.async_scheduling=true")
    assert sync.shape == late.shape == ((33 + 26 + 19) * 1920,)
    rms = float(np.sqrt(np.mean(sync**2)))
    err = float(np.sqrt(np.mean((late - sync) ** 2)))
    print(f"async vs sync PCM ({chunks[0].rsplit('=', 1)[1]}-frame chunks): error rms {err:.3e}")
    assert rms > 1e-3 and err < 1e-2 * rms
