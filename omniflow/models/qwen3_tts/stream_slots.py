"""Per-request streaming decoder slots of the fused talker (docs/architecture.md: the fused
pipeline).

A request takes a slot of the `StreamingDecoder` at its first frame and decodes each new
frame's 1,920 samples from it. Preemption parks the slot's state (recompute rebuilds the
talker's KV, not the decoder's carried audio state) and frees the slot; the resumed request
gets a slot back with that state restored (a primed slot's state included, so a resumed
voice-clone request continues exactly). Without a decoder every call is a no-op.

Voice clone: a slot taken for a request with reference codes waiting in `priming` is primed
with them (eagerly, grouped by length) before its first frame is decoded, by graph or not.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omniflow.models.interface import Frame, SampledStep
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.models.qwen3_tts.priming import ReferencePriming
from omniflow.models.upload import to_device, upload_ints


class StreamSlots:
    """Which request holds which decoder slot, and the parked state of preempted ones."""

    def __init__(
        self,
        decoder: StreamingDecoder | None,
        graphs: DecoderStepGraphs | None = None,
        priming: ReferencePriming | None = None,
        window_graphs: DecoderStepGraphs | None = None,
    ) -> None:
        self.decoder = decoder
        self.priming = priming
        """Reference frames waiting for their request's first frame (None: no voice clone)."""
        self.graphs = graphs
        """The decoder's per-frame step as CUDA graphs per batch bucket (None: eager)."""
        self.window_graphs = window_graphs
        """The decoder over a whole window's frames per row (`frames` = window_k) as CUDA
        graphs per batch bucket (None: a window's frames are decoded eagerly)."""
        self._slots: dict[str, int] = {}
        self._parked: dict[str, dict[str, torch.Tensor]] = {}

    def admit(self, request_id: str) -> None:
        """A resumed request gets a slot back with its parked state."""
        snap = self._parked.pop(request_id, None)
        if snap is not None and self.decoder is not None:
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
            self._parked[request_id] = self.decoder.snapshot(slot)
            self.decoder.release(slot)

    def decode(self, steps: Sequence[SampledStep]) -> dict[str, np.ndarray]:
        """The samples of every new frame of one or more consecutive steps, per request, in
        order, from its slot (taken at its first frame); rows without a frame (EOS) produce
        none. One step's frames are read from its `next_frames` on the device by the
        per-frame graph; a window's frames are decoded per request in one pass, by the
        window graph where a request has exactly its `frames` new frames, else by the
        per-frame graph once per frame."""
        dec = self.decoder
        if dec is None:
            return {}
        frames: dict[str, list[Frame]] = {}
        for step in steps:
            for rid, f in zip(step.request_ids, step.sample.outputs, strict=True):
                if f is not None:
                    frames.setdefault(rid, []).append(f)
        if not frames:
            return {}
        self._take_slots(list(frames))
        if len(steps) == 1 and self.graphs is not None:
            return self._graph_step(steps[0], list(frames))
        out: dict[str, np.ndarray] = {}
        groups: dict[int, list[str]] = {}
        for rid, fs in frames.items():
            groups.setdefault(len(fs), []).append(rid)
        for n, rids in groups.items():
            out.update(self._decode_group(rids, [frames[rid] for rid in rids], n))
        return {rid: out[rid] for rid in frames}

    def _decode_group(
        self, rids: list[str], frames: list[list[Frame]], n: int
    ) -> dict[str, np.ndarray]:
        """Rows with n new frames each: the window graph when it takes exactly n frames;
        else the per-frame graph replayed n times (a request's last, shorter window; the
        eager decoder step took 14.7 ms at batch 1 on the H200, a replay ~3 ms,
        docs/benchmarks.md); eager only without graphs."""
        dec = self.decoder
        assert dec is not None
        codes = torch.tensor(frames, dtype=torch.int64)  # [rows, n, 16]
        if self.window_graphs is not None and self.window_graphs.frames == n:
            graphs, passes = self.window_graphs, [codes]
        elif self.graphs is not None:
            graphs, passes = self.graphs, [codes[:, j] for j in range(n)]
        else:  # eager: the rows run as one batch
            pcm = dec.decode([self._slots[rid] for rid in rids], list(codes))
            return {rid: p.float().cpu().numpy() for rid, p in zip(rids, pcm, strict=True)}
        ids = upload_ints([self._slots[rid] for rid in rids], dec.device)
        parts = [graphs.run(ids, to_device(c, dec.device)) for c in passes]
        pcm = torch.cat(parts, dim=1).float().cpu().numpy()  # one copy for all rows
        return dict(zip(rids, pcm, strict=True))

    def _take_slots(self, request_ids: list[str]) -> None:
        """A slot for each request at its first frame, primed with its reference frames
        (voice clone) before anything is decoded in it."""
        dec = self.decoder
        assert dec is not None
        primed: list[int] = []
        refs: list[torch.Tensor] = []
        for rid in request_ids:
            if rid not in self._slots:
                self._slots[rid] = dec.allocate()
                ref = self.priming.take(rid) if self.priming is not None else None
                if ref is not None:
                    primed.append(self._slots[rid])
                    refs.append(ref)
        if primed:
            dec.prime(primed, refs)

    def _graph_step(self, step: SampledStep, request_ids: list[str]) -> dict[str, np.ndarray]:
        """One frame per row by the per-frame graph, its codes read on the device."""
        assert self.graphs is not None and self.decoder is not None
        outputs = step.sample.outputs
        keep = [i for i, f in enumerate(outputs) if f is not None]
        ids = upload_ints([self._slots[rid] for rid in request_ids], self.decoder.device)
        codes = step.sample.next_frames
        if len(keep) != len(outputs):
            codes = codes.index_select(0, upload_ints(keep, codes.device))
        out = self.graphs.run(ids, codes).float().cpu().numpy()  # one copy for all rows
        return dict(zip(request_ids, out, strict=True))

    def slots_in_use(self) -> tuple[int, int] | None:
        dec = self.decoder
        return None if dec is None else (dec.num_in_use, dec.num_slots)

    def parked_ids(self) -> frozenset[str]:
        return frozenset(self._parked)
