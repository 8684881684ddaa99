"""The fused pipeline's per-step codec decode (one new frame per request -> 1,920 samples) as
one CUDA graph per batch bucket; with `frames=n`, n new frames per request at once (the end of
a K-step window decodes its K frames per request in one replay: one pass of the decoder over
n frames costs about what one frame does at small batches, where the step is latency-bound).

Eagerly a step is several hundred small kernels (codebook lookups, 8 transformer layers,
dozens of convs), so at small batches it is bound by launch overhead, not by its work.
Replaying a captured graph launches them all at once. A graph records fixed shapes and
addresses, so each bucket reads slot ids and codes from static buffers and writes PCM to a
static output: `run` copies B rows into the first B rows of the smallest bucket >= B, pads
the rest with the decoder's `padding_slot` and zero codes, replays, and returns a copy of
the first B rows. The recorded step is `StreamingDecoder.decode_step`, which gathers each
row's carried state from the slot pool by id and scatters it back: the pool tensors are
updated in place, so their addresses stay what the graph recorded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from omniflow.device.bucket_graphs import BATCH_BUCKETS, BucketGraphs
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder


class DecoderStepGraphs(BucketGraphs):
    """Bucketed CUDA graphs of `decoder.decode_step`, captured lazily (or all at once with
    `capture_all`) into one memory pool shared by the buckets.

    The buckets share one set of static buffers of `max_batch` rows (a bucket of size k reads
    and writes rows [:k]), which is safe because replays run one at a time on one stream
    (`stream`, when the decoder runs on a stream of its own: captured there too).
    Without CUDA, or with `capture=False`, the same buffers, padding and step run eagerly (the
    CPU tests and a kill switch exercise everything but the capture)."""

    def __init__(
        self,
        decoder: StreamingDecoder,
        max_batch: int,
        buckets: Sequence[int] = BATCH_BUCKETS,
        capture: bool = True,
        warmup_iters: int = 2,
        frames: int = 1,
        stream: torch.cuda.Stream | None = None,
        pool: tuple[int, int] | None = None,
    ) -> None:
        if frames < 1:
            raise ValueError(f"frames must be >= 1, got {frames}")
        self.decoder = decoder
        self.max_batch = max_batch
        self.frames = frames
        """New frames per row in each replay (codes [B, 16] when 1, else [B, frames, 16])."""
        super().__init__(decoder.device, max_batch, buckets, capture, warmup_iters, stream, pool)
        self.label = "codec decoder step" if frames == 1 else f"codec decoder {frames}-frame"
        dev = self.device
        pad = decoder.padding_slot
        self.slot_ids = torch.full((max_batch,), pad, device=dev, dtype=torch.int64)
        per_row = (decoder.num_codebooks,) if frames == 1 else (frames, decoder.num_codebooks)
        self.codes = torch.zeros(max_batch, *per_row, device=dev, dtype=torch.int64)
        self.pcm = torch.zeros(
            max_batch, frames * decoder.samples_per_frame, device=dev, dtype=decoder.dtype
        )

    @torch.no_grad()
    def run(self, slot_ids: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """PCM [B, frames * 1920] of `frames` new frames per row, as a new tensor (a clone
        of the static output: the next replay overwrites it). slot_ids [B] int64: distinct
        allocated slots of the decoder; codes [B, 16] (frames 1) or [B, frames, 16] int64.
        Each slot's state advances by `frames` frames."""
        b = slot_ids.shape[0]
        if slot_ids.shape != (b,) or codes.shape != (b, *self.codes.shape[1:]):
            raise ValueError(
                f"slot_ids {tuple(slot_ids.shape)} and codes {tuple(codes.shape)} do not "
                f"describe {b} rows of {tuple(self.codes.shape[1:])} codes"
            )
        if b == 0:
            return self.pcm[:0].clone()
        k = self.bucket_for(b)
        if k is None:
            ids = slot_ids.to(device=self.device, dtype=torch.int64)
            return self.decoder.decode_step(ids, codes.to(device=self.device, dtype=torch.int64))
        if self.graphed and k not in self.graphs:
            self._capture(k)  # before loading: the warm-up overwrites the buffers
        self._load(b, k, slot_ids, codes)
        self._compute(k)
        return self.pcm[:b].clone()

    @torch.no_grad()
    def warm_up(self, k: int) -> None:
        """Run bucket k's step eagerly `warmup_iters` times with every row the padding slot.

        A capture needs real runs of the same step first (cuBLAS/cuDNN set up lazily, and
        nothing may be set up inside a capture). Unlike a KV-cache write, a streaming step
        advances the state it reads (positions, KV rings, conv histories), so a warm-up over
        whatever slot ids the buffers hold (the previous batch's real requests) would push
        those requests a frame ahead and garble their audio. Snapshot and restore would work
        too, but cost a copy of every live slot's state (~5 MB per slot at the 1.7B shapes) per
        capture. Padding rows cost nothing: the padding slot is the one row nothing reads, and
        the same kernels run at the same shapes whatever the slot ids are."""
        self.slot_ids[:k].fill_(self.decoder.padding_slot)
        self.codes[:k].zero_()
        for _ in range(self.warmup_iters):
            self._step(k)

    def _warm_up(self, k: int) -> None:
        self.warm_up(k)

    def _load(self, b: int, k: int, slot_ids: torch.Tensor, codes: torch.Tensor) -> None:
        """Rows [:b] from the inputs, rows [b:k] the padding slot with zero codes."""
        self.slot_ids[:b].copy_(slot_ids)
        self.codes[:b].copy_(codes)
        if b < k:
            self.slot_ids[b:k].fill_(self.decoder.padding_slot)
            self.codes[b:k].zero_()

    def _step(self, k: int) -> None:
        """Bucket k's computation over the static buffers (what its graph records)."""
        self.pcm[:k].copy_(self.decoder.decode_step(self.slot_ids[:k], self.codes[:k]))


def pass_sizes(frames: int) -> tuple[int, ...]:
    """The frames per row of the decoder's graph sets under passes of `frames` (a window's
    or a chunk's), largest first: `frames`, the powers of two below it, and 1. Why: a window
    cut short by an arrival, or a request's last shorter window, leaves n < `frames` frames;
    `split_frames` decodes them in at most log2(n) + 1 passes instead of n per-frame ones,
    and the arrival's first audio queues behind those passes on the decoder's stream."""
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    powers = {1 << i for i in range(frames.bit_length()) if 1 << i < frames}
    return tuple(sorted(powers | {frames}, reverse=True))


def split_frames(n: int, sizes: Sequence[int]) -> list[int]:
    """n frames as consecutive passes of the given sizes (1 among them), largest first:
    7 over (8, 4, 2, 1) -> [4, 2, 1]."""
    if 1 not in sizes:
        raise ValueError(f"pass sizes {tuple(sizes)} have no 1: not every count splits")
    parts: list[int] = []
    for size in sorted(sizes, reverse=True):
        while n >= size:
            parts.append(size)
            n -= size
    return parts


def decoder_pass_graphs(
    decoder: StreamingDecoder, max_batch: int, frames: int, stream: torch.cuda.Stream | None
) -> dict[int, DecoderStepGraphs]:
    """A graph set per `pass_sizes(frames)`, captured now (largest first) into one memory
    pool: every pass runs on `stream`, one after another, so the sets may share it."""
    sets: dict[int, DecoderStepGraphs] = {}
    pool = None
    for size in pass_sizes(frames):
        graphs = DecoderStepGraphs(decoder, max_batch, frames=size, stream=stream, pool=pool)
        graphs.capture_all()
        pool = graphs.pool
        sets[size] = graphs
    return sets
