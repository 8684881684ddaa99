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

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from omniflow.device.upload import to_device, upload_ints
from omniflow.models.interface import Frame, SampledStep
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs, split_frames
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.models.qwen3_tts.pending_pcm import PendingPcm, to_host
from omniflow.models.qwen3_tts.priming import ReferencePriming
from omniflow.models.qwen3_tts.window_codes import gather_codes, prefix_counts


class StreamSlots:
    """Which request holds which decoder slot, and the parked state of preempted ones."""

    def __init__(
        self,
        decoder: StreamingDecoder | None,
        passes: Mapping[int, DecoderStepGraphs] | None = None,
        priming: ReferencePriming | None = None,
        side: torch.cuda.Stream | None = None,
    ) -> None:
        self.decoder = decoder
        self.side = side
        """The stream every decoder pass runs on (None: the caller's stream, synchronously)."""
        self.priming = priming
        """Reference frames waiting for their request's first frame (None: no voice clone)."""
        self.passes = dict(passes or {})
        """The decoder over n new frames per row as CUDA graphs per batch bucket, by n
        (`codec_graph.pass_sizes`: 1, the window's or chunk's frames and the powers of two
        between); empty: eager. With graphs, 1 is always among them."""
        if self.passes and 1 not in self.passes:
            raise ValueError(f"decoder pass graphs {sorted(self.passes)} have no 1-frame set")
        self._slots: dict[str, int] = {}
        self._parked: dict[str, dict[str, torch.Tensor]] = {}
        self._spent: set[str] = set()
        """Requests whose slot a padded pass ran past their last frame (`window_codes`): they
        end with the window; decoding from that slot again would be wrong audio, so it is
        refused."""
        self.device_windows = 0
        """Calls over several steps whose codes were read on the device (`_device_passes`);
        tests read it."""
        self.padded_rows = 0
        """Rows decoded past their last frame in such calls (they stopped early); tests read
        it."""

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
        self._spent.discard(request_id)
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
        none. With graphs, where each row's frames are those of the first steps (a
        window's rows stop one by one: `window_codes.prefix_counts`), the codes are read on
        the device from the steps' `next_frames` and all rows run the longest row's passes,
        the shorter padded and cut back; else rows are grouped by their frame count and
        their codes built on the host. n frames run as `split_frames(n)` passes of the pass
        graphs (8 -> one 8-frame pass, 7 -> 4 + 2 + 1), eagerly without graphs. On the side
        stream the passes are only queued."""
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
        counts = prefix_counts(steps) if self.passes else None
        if counts is not None:
            self._handed_over(steps)
        keep: dict[str, int] = {}
        with torch.cuda.stream(self.side):  # None: the caller's stream
            self._take_slots(list(frames))
            if counts is not None:
                parts = [self._device_passes(steps, counts)]
                most = max(counts.values())
                keep = {r: n * dec.samples_per_frame for r, n in counts.items() if n < most}
                self._spent.update(keep)
                self.padded_rows += len(keep)
            else:
                groups: dict[int, list[str]] = {}
                for rid, fs in frames.items():
                    groups.setdefault(len(fs), []).append(rid)
                parts = [
                    self._decode_group(rids, [frames[rid] for rid in rids], n)
                    for n, rids in groups.items()
                ]
            return PendingPcm(tuple(frames), parts, self._stream(), dec.dtype, keep)

    def queue_ahead(
        self,
        request_ids: Sequence[str],
        frames: torch.Tensor,
        made: torch.cuda.Event | None,
    ) -> PendingPcm:
        """One step's frame of every row, decoded from its device codes `frames` [B, G]
        before the host has read them (`ARModel.queue_audio_ahead`; `made`: recorded behind
        them). A row that drew the stop token decodes a frame that is not audio (the caller
        drops its PCM) and its request ends with this step, so its slot is never decoded
        from again. The stop token is not a code: clamped into the codebook, the decoder's
        lookup stays in range."""
        dec = self.decoder
        if dec is None or not request_ids:
            return PendingPcm((), [])
        with torch.cuda.stream(self.side):  # None: the caller's stream
            # before the wait for the codes: a voice-clone slot's priming reads its reference
            # codes to the device synchronously, which would wait for the sampling too
            self._take_slots(list(request_ids))
        self._hand_over(frames, made)
        with torch.cuda.stream(self.side):
            ids = upload_ints([self._slots[rid] for rid in request_ids], dec.device)
            codes = frames.clamp_max(dec.codebook_size - 1)
            pcm = self.passes[1].run(ids, codes) if self.passes else dec.decode_step(ids, codes)
            part = (list(request_ids), to_host(pcm.float()))
            return PendingPcm(tuple(request_ids), [part], self._stream(), dec.dtype)

    def _device_passes(
        self, steps: Sequence[SampledStep], counts: dict[str, int]
    ) -> tuple[list[str], torch.Tensor]:
        """The rows' frames straight from the steps' `next_frames` (why: codes built from
        the host's tuples, `torch.tensor` over rows x frames x 16 Python ints, are slow at
        large batches, and the GPU waits for them), as `split_frames` passes over the
        longest row's frames; rows that stopped earlier padded (`window_codes`). One copy
        to the host for all."""
        assert self.decoder is not None
        request_ids = list(counts)
        ids = upload_ints([self._slots[rid] for rid in request_ids], self.decoder.device)
        if len(steps) == 1:
            outputs = steps[0].sample.outputs
            keep = [i for i, f in enumerate(outputs) if f is not None]
            codes = steps[0].sample.next_frames
            if len(keep) != len(outputs):
                codes = codes.index_select(0, upload_ints(keep, codes.device))
            return request_ids, to_host(self.passes[1].run(ids, codes).float())
        self.device_windows += 1
        n = max(counts.values())
        rows = len(request_ids)
        every = n == len(steps) and min(counts.values()) == n
        if every and all(len(step.request_ids) == rows for step in steps):
            # every row has a frame in every step: the steps' codes as they are

            def codes(start: int, size: int) -> torch.Tensor:
                part = [step.sample.next_frames for step in steps[start : start + size]]
                return part[0] if size == 1 else torch.stack(part, dim=1)

        else:
            gathered = gather_codes(steps, counts, self.decoder.device)

            def codes(start: int, size: int) -> torch.Tensor:
                part = gathered[:, start] if size == 1 else gathered[:, start : start + size]
                return part.contiguous()  # rows of a pass, as the graphs' buffers hold them

        return request_ids, to_host(self._split_passes(ids, n, codes).float())

    def _split_passes(
        self, ids: torch.Tensor, n: int, codes: Callable[[int, int], torch.Tensor]
    ) -> torch.Tensor:
        """n frames per row as `split_frames(n)` consecutive passes; `codes(start, size)`
        gives a pass's codes ([B, 16] for one frame, else [B, size, 16]). PCM [B, n * 1920]."""
        pcm, start = [], 0
        for size in split_frames(n, tuple(self.passes)):
            pcm.append(self.passes[size].run(ids, codes(start, size)))
            start += size
        return torch.cat(pcm, dim=1)

    def _handed_over(self, steps: Sequence[SampledStep]) -> None:
        """Make the steps' device codes readable on the side stream (nothing without one):
        it waits for each step's `made` event (for the caller's whole queue where a step has
        none), and each `next_frames` is marked as used there, so the caching allocator does
        not give its memory back to the caller's stream while the side stream still reads
        it. `next_frames` is a fresh tensor per step (`ARModel.queue_frames`), never
        rewritten after `made`."""
        for step in steps:
            self._hand_over(step.sample.next_frames, step.sample.made)

    def _hand_over(self, frames: torch.Tensor, made: torch.cuda.Event | None) -> None:
        """`_handed_over` for one step's codes: the side stream reads them once written, and
        their memory stays theirs until it has."""
        side = self.side
        if side is None:
            return
        if made is None:
            side.wait_stream(torch.cuda.current_stream(frames.device))
        else:
            side.wait_event(made)
        frames.record_stream(side)

    def _decode_group(
        self, rids: list[str], frames: list[list[Frame]], n: int
    ) -> tuple[list[str], torch.Tensor]:
        """Rows with n new frames each, their codes built on the host: `split_frames(n)`
        passes of the graphs (a replay is much cheaper than the eager decoder step, see
        docs/performance.md); eager only without graphs. Returns the rows and their PCM
        [rows, n * 1920], on its way to the host."""
        dec = self.decoder
        assert dec is not None
        codes = torch.tensor(frames, dtype=torch.int64)  # [rows, n, 16]
        if not self.passes:  # eager: the rows run as one batch
            pcm = dec.decode([self._slots[rid] for rid in rids], list(codes))
            return rids, to_host(torch.stack(pcm).float())
        ids = upload_ints([self._slots[rid] for rid in rids], dec.device)

        def part(start: int, size: int) -> torch.Tensor:
            host = codes[:, start] if size == 1 else codes[:, start : start + size]
            return to_device(host, dec.device)

        return rids, to_host(self._split_passes(ids, n, part).float())  # one copy for all rows

    def _take_slots(self, request_ids: list[str]) -> None:
        """A slot for each request at its first frame, primed with its reference frames
        (voice clone) before anything is decoded in it."""
        dec = self.decoder
        assert dec is not None
        spent = self._spent.intersection(request_ids)
        if spent:
            raise RuntimeError(
                f"decoder slots of {sorted(spent)} were run past their last frame in a window "
                "(each was to end there); their audio cannot go on"
            )
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

    def slots_in_use(self) -> tuple[int, int] | None:
        dec = self.decoder
        return None if dec is None else (dec.num_in_use, dec.num_slots)

    def parked_ids(self) -> frozenset[str]:
        return frozenset(self._parked)
