"""Per-request streaming decoder slots of the fused talker (docs/architecture.md: the fused
pipeline).

A request takes a slot of the `StreamingDecoder` at its first frame and decodes each new
frame's 1,920 samples from it. Preemption parks the slot's state (recompute rebuilds the
talker's KV, not the decoder's carried audio state) and frees the slot; the resumed request
gets a slot back with that state restored (a primed slot's state included, so a resumed
voice-clone request continues exactly). Without a decoder every call is a no-op.

Voice clone: a slot taken for a request with reference codes waiting in `priming` is primed
with them (eagerly, grouped by length) before its first frame is decoded, by graph or not.

Overlap (`side`, a second CUDA stream): `queue` then runs every decoder pass on that stream and
returns at once with the PCM copying to pinned host memory; `PendingPcm.result` waits for
it. The runner queues a window's first chunks while the window's later steps compute on the
main stream (`audio_chunk_frames`, docs/architecture.md), and a window's last pass while the
next window computes. All decoder work of the stage goes through the side stream then (slot
zeroing, priming, parking, restoring, each pass), so it is ordered among itself. A pass
reads its codes on the device where the steps' `next_frames` allow it (`_handed_over`): the
side stream waits for each step's `made` event, recorded right behind that step's frames,
so not for the main stream's later work (the window's next step, queued before the host
reads this one back). Its graphs are captured on it (`BucketGraphs.capture_stream`: cuBLAS's
workspace is per stream).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omniflow.core.audio import AudioFailed
from omniflow.device.upload import to_device, upload_ints
from omniflow.models.interface import Frame, SampledStep
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder, nonfinite, overflow_error
from omniflow.models.qwen3_tts.priming import ReferencePriming


class StreamSlots:
    """Which request holds which decoder slot, and the parked state of preempted ones."""

    def __init__(
        self,
        decoder: StreamingDecoder | None,
        graphs: DecoderStepGraphs | None = None,
        priming: ReferencePriming | None = None,
        window_graphs: DecoderStepGraphs | None = None,
        side: torch.cuda.Stream | None = None,
    ) -> None:
        self.decoder = decoder
        self.side = side
        """The stream every decoder pass runs on (None: the caller's stream, synchronously)."""
        self.priming = priming
        """Reference frames waiting for their request's first frame (None: no voice clone)."""
        self.graphs = graphs
        """The decoder's per-frame step as CUDA graphs per batch bucket (None: eager)."""
        self.window_graphs = window_graphs
        """The decoder over a window's frames per row (`frames`: window_k, or
        audio_chunk_frames when a window is decoded in chunks) as CUDA graphs per batch
        bucket (None: a window's frames are decoded eagerly)."""
        self._slots: dict[str, int] = {}
        self._parked: dict[str, dict[str, torch.Tensor]] = {}
        self.device_windows = 0
        """Window passes whose codes were read on the device (`_window_on_device`); tests
        read it."""

    def _stream(self) -> torch.cuda.Stream | None:
        """The stream the decoder's work is queued on (None: not CUDA)."""
        dec = self.decoder
        if self.side is not None or dec is None or dec.device.type != "cuda":
            return self.side
        return torch.cuda.current_stream(dec.device)

    def admit(self, request_id: str) -> None:
        """A resumed request gets a slot back with its parked state."""
        snap = self._parked.pop(request_id, None)
        if snap is not None and self.decoder is not None:
            with torch.cuda.stream(self.side):  # None: the caller's stream
                slot = self.decoder.allocate()
                self.decoder.restore(slot, snap)
            self._slots[request_id] = slot

    def finish(self, request_id: str) -> None:
        self._parked.pop(request_id, None)
        if self.priming is not None:
            self.priming.discard(request_id)
        slot = self._slots.pop(request_id, None)
        if slot is not None and self.decoder is not None:
            self.decoder.release(slot)

    def preempt(self, request_id: str) -> None:
        slot = self._slots.pop(request_id, None)
        if slot is not None and self.decoder is not None:
            with torch.cuda.stream(self.side):  # after the slot's queued passes, on that stream
                self._parked[request_id] = self.decoder.snapshot(slot)
            self.decoder.release(slot)

    def decode(self, steps: Sequence[SampledStep]) -> dict[str, np.ndarray]:
        """`queue(steps)`, waited for."""
        return self.queue(steps).result()

    def queue(self, steps: Sequence[SampledStep]) -> PendingPcm:
        """The samples of every new frame of one or more consecutive steps, per request, in
        order, from its slot (taken at its first frame); rows without a frame (EOS) produce
        none. One step's frames are read from its `next_frames` on the device by the
        per-frame graph; several steps' frames are decoded per request in one pass, by the
        window graph where a request has exactly its `frames` new frames (read on the device
        too when every row has them: `_whole_window`), else by the per-frame graph once per
        frame. On the side stream the passes are only queued."""
        dec = self.decoder
        if dec is None:
            return PendingPcm((), [])
        frames: dict[str, list[Frame]] = {}
        for step in steps:
            for rid, f in zip(step.request_ids, step.sample.outputs, strict=True):
                if f is not None:
                    frames.setdefault(rid, []).append(f)
        if not frames:
            return PendingPcm((), [])
        single = len(steps) == 1 and self.graphs is not None
        window = not single and self._whole_window(steps)
        if single or window:
            self._handed_over(steps)
        with torch.cuda.stream(self.side):  # None: the caller's stream
            self._take_slots(list(frames))
            if single:
                parts = [self._graph_step(steps[0], list(frames))]
            elif window:
                parts = [self._window_pass(steps)]
            else:
                groups: dict[int, list[str]] = {}
                for rid, fs in frames.items():
                    groups.setdefault(len(fs), []).append(rid)
                parts = [
                    self._decode_group(rids, [frames[rid] for rid in rids], n)
                    for n, rids in groups.items()
                ]
            return PendingPcm(tuple(frames), parts, self._stream(), dec.dtype)

    def _whole_window(self, steps: Sequence[SampledStep]) -> bool:
        """Whether the window graph can read the steps' codes on the device (each step's
        `next_frames`, stacked): every step sampled a frame for the same rows in the same
        order (no row left early, none drew EOS) and the graph takes exactly that many
        frames. Else the caller groups the rows by their frame count and builds the codes
        on the host. Why: building them from the host's tuples (`torch.tensor` over rows x
        frames x 16 Python ints) is slow at large batches, and the GPU waits for it between a
        window's last frame and its decoder pass."""
        graphs = self.window_graphs
        if graphs is None or graphs.frames != len(steps):
            return False
        rids = steps[0].request_ids
        return all(
            step.request_ids == rids and all(f is not None for f in step.sample.outputs)
            for step in steps
        )

    def _window_pass(self, steps: Sequence[SampledStep]) -> tuple[list[str], torch.Tensor]:
        """The window graph over the steps' device codes (`_whole_window`)."""
        assert self.decoder is not None and self.window_graphs is not None
        rids = list(steps[0].request_ids)
        codes = torch.stack([step.sample.next_frames for step in steps], dim=1)
        ids = upload_ints([self._slots[rid] for rid in rids], self.decoder.device)
        self.device_windows += 1
        return rids, to_host(self.window_graphs.run(ids, codes).float())  # one copy for all

    def _handed_over(self, steps: Sequence[SampledStep]) -> None:
        """Make the steps' device codes readable on the side stream (nothing without one):
        it waits for each step's `made` event (for the caller's whole queue where a step has
        none), and each `next_frames` is marked as used there, so the caching allocator does
        not give its memory back to the caller's stream while the side stream still reads
        it. `next_frames` is a fresh tensor per step (`ARModel.queue_frames`), never
        rewritten after `made`."""
        side = self.side
        if side is None:
            return
        for step in steps:
            frames = step.sample.next_frames
            made = step.sample.made
            if made is None:
                side.wait_stream(torch.cuda.current_stream(frames.device))
            else:
                side.wait_event(made)
            frames.record_stream(side)

    def _decode_group(
        self, rids: list[str], frames: list[list[Frame]], n: int
    ) -> tuple[list[str], torch.Tensor]:
        """Rows with n new frames each: the window graph when it takes exactly n frames;
        else the per-frame graph replayed n times (a request's last, shorter window: a
        replay is much cheaper than the eager decoder step, measured: see
        docs/performance.md); eager only without graphs. Returns the rows and their PCM
        [rows, n * 1920], on its way to the host."""
        dec = self.decoder
        assert dec is not None
        codes = torch.tensor(frames, dtype=torch.int64)  # [rows, n, 16]
        if self.window_graphs is not None and self.window_graphs.frames == n:
            graphs, passes = self.window_graphs, [codes]
        elif self.graphs is not None:
            graphs, passes = self.graphs, [codes[:, j] for j in range(n)]
        else:  # eager: the rows run as one batch
            pcm = dec.decode([self._slots[rid] for rid in rids], list(codes))
            return rids, to_host(torch.stack(pcm).float())
        ids = upload_ints([self._slots[rid] for rid in rids], dec.device)
        parts = [graphs.run(ids, to_device(c, dec.device)) for c in passes]
        return rids, to_host(torch.cat(parts, dim=1).float())  # one copy for all rows

    def _take_slots(self, request_ids: list[str]) -> None:
        """A slot for each request at its first frame, primed with its reference frames
        (voice clone) before anything is decoded in it."""
        dec = self.decoder
        assert dec is not None
        primed: list[int] = []
        refs: list[torch.Tensor] = []
        fresh = [rid for rid in request_ids if rid not in self._slots]
        for rid, slot in zip(fresh, dec.allocate_many(len(fresh)), strict=True):
            self._slots[rid] = slot
            ref = self.priming.take(rid) if self.priming is not None else None
            if ref is not None:
                primed.append(slot)
                refs.append(ref)
        if primed:
            dec.prime(primed, refs)

    def _graph_step(
        self, step: SampledStep, request_ids: list[str]
    ) -> tuple[list[str], torch.Tensor]:
        """One frame per row by the per-frame graph, its codes read on the device."""
        assert self.graphs is not None and self.decoder is not None
        outputs = step.sample.outputs
        keep = [i for i, f in enumerate(outputs) if f is not None]
        ids = upload_ints([self._slots[rid] for rid in request_ids], self.decoder.device)
        codes = step.sample.next_frames
        if len(keep) != len(outputs):
            codes = codes.index_select(0, upload_ints(keep, codes.device))
        return request_ids, to_host(self.graphs.run(ids, codes).float())  # one copy for all

    def slots_in_use(self) -> tuple[int, int] | None:
        dec = self.decoder
        return None if dec is None else (dec.num_in_use, dec.num_slots)

    def parked_ids(self) -> frozenset[str]:
        return frozenset(self._parked)


class PendingPcm:
    """A decoder call's PCM per request, copying to the host: `result()` waits for it.

    On CUDA each part is one device-to-host copy into pinned memory, queued on the stream
    that decoded it, with an event after them all; elsewhere the parts are already on the
    host."""

    def __init__(
        self,
        order: tuple[str, ...],
        parts: list[tuple[list[str], torch.Tensor]],
        stream: torch.cuda.Stream | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.order = order
        """The requests, in the order their PCM is returned."""
        self.parts = parts
        self.dtype = dtype
        """The decoder's: below float32 the PCM is checked for overflow (`nonfinite`)."""
        self.done: torch.cuda.Event | None = None
        """Recorded on `stream` (the decoder's, CUDA) after the copies to the host."""
        if stream is not None and parts:
            self.done = torch.cuda.Event()
            self.done.record(stream)

    def result(self) -> dict[str, np.ndarray]:
        """PCM per request, copied out of the pinned buffers: they go back to torch's pinned
        cache at once instead of riding along in the audio events (a whole response would
        hold its pass's buffer until the request ends, and torch never frees pinned memory).
        `AudioFailed` for the rows a reduced-precision decoder overflowed in."""
        if self.done is not None:
            self.done.synchronize()
        pcm: dict[str, np.ndarray] = {}
        bad: dict[str, str] = {}
        for rids, host in self.parts:
            rows = host.numpy()
            for rid in nonfinite(self.dtype, rids, rows):
                bad[rid] = overflow_error(self.dtype)
            if self.done is not None:  # each row its own array: none keeps a pass's batch
                pcm.update((rid, row.copy()) for rid, row in zip(rids, rows, strict=True))
            else:
                pcm.update(zip(rids, rows, strict=True))
        good = {rid: pcm[rid] for rid in self.order if rid not in bad}
        if bad:
            raise AudioFailed(bad, good)
        return good


def to_host(pcm: torch.Tensor) -> torch.Tensor:
    """`pcm` on the host; from CUDA, copying into pinned memory without a wait (read it only
    after the stream's work is done: `PendingPcm.result`)."""
    if pcm.device.type != "cuda":
        return pcm
    host = torch.empty(pcm.shape, dtype=pcm.dtype, pin_memory=True)
    return host.copy_(pcm, non_blocking=True)
