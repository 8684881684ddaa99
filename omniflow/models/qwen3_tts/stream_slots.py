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

from omniflow.models.interface import Frame
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.models.qwen3_tts.priming import ReferencePriming


class StreamSlots:
    """Which request holds which decoder slot, and the parked state of preempted ones."""

    def __init__(
        self,
        decoder: StreamingDecoder | None,
        graphs: DecoderStepGraphs | None = None,
        priming: ReferencePriming | None = None,
    ) -> None:
        self.decoder = decoder
        self.priming = priming
        """Reference frames waiting for their request's first frame (None: no voice clone)."""
        self.graphs = graphs
        """The decoder's per-frame step as CUDA graphs per batch bucket (None: eager)."""
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

    def decode(
        self,
        request_ids: Sequence[str],
        frames: Sequence[Frame | None],
        device_frames: torch.Tensor | None = None,
    ) -> dict[str, np.ndarray]:
        """Each new frame's samples from its request's slot (taken at its first frame);
        rows without a frame (EOS) produce none. With step graphs, the frames are read from
        `device_frames` [B, 16] (the sampler's output, already on the device)."""
        dec = self.decoder
        if dec is None:
            return {}
        rows = [(rid, f) for rid, f in zip(request_ids, frames, strict=True) if f is not None]
        if not rows:
            return {}
        primed: list[int] = []
        refs: list[torch.Tensor] = []
        for rid, _ in rows:
            if rid not in self._slots:
                self._slots[rid] = dec.allocate()
                ref = self.priming.take(rid) if self.priming is not None else None
                if ref is not None:
                    primed.append(self._slots[rid])
                    refs.append(ref)
        if primed:
            dec.prime(primed, refs)
        if self.graphs is not None and device_frames is not None:
            keep = [i for i, f in enumerate(frames) if f is not None]
            ids = torch.tensor([self._slots[rid] for rid, _ in rows], device=dec.device)
            codes = device_frames
            if len(keep) != len(frames):
                codes = codes.index_select(0, torch.tensor(keep, device=codes.device))
            out = self.graphs.run(ids, codes).float().cpu().numpy()  # one copy for all rows
            return {rid: out[j] for j, (rid, _) in enumerate(rows)}
        codes = [torch.tensor([f], dtype=torch.int64) for _, f in rows]
        pcm = dec.decode([self._slots[rid] for rid, _ in rows], codes)
        return {rid: p.float().cpu().numpy() for (rid, _), p in zip(rows, pcm, strict=True)}

    def slots_in_use(self) -> tuple[int, int] | None:
        dec = self.decoder
        return None if dec is None else (dec.num_in_use, dec.num_slots)

    def parked_ids(self) -> frozenset[str]:
        return frozenset(self._parked)
