"""The code predictor's whole frame (code0 embedding, 2-token prefill, 14 steps, 15 draws)
as one CUDA graph per batch bucket.

Eagerly the frame is hundreds of tiny kernels, so it is bound by launch overhead (measured:
see docs/performance.md); replaying a captured graph
launches them all at once. A graph records fixed shapes and addresses, so each bucket reads
its inputs from static buffers and writes its codes to a static output: `run` copies a
batch of B rows into the first B rows of the smallest bucket >= B, pads the rest with
harmless rows (zero hidden state, code0 0, temperature 0 = greedy), replays, and returns a
copy of the first B rows.

Sampling is injected (`FrameSampleFn`): models do not import the runner's sampler, and the
wrapper owns the per-row seeds, counters and temperatures as static buffers, so the draw
must take them as arguments rather than close over a per-call batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from omniflow.device.bucket_graphs import BATCH_BUCKETS, BucketGraphs
from omniflow.models.layers.qwen3 import KVCaches
from omniflow.models.qwen3_tts.code_predictor import CodePredictor

FrameSampleFn = Callable[
    [torch.Tensor, int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
"""(logits [B, V], codebook g in 1..15, seeds [B] int64, counters [B] int64,
temperature [B] float32; 0 = greedy) -> codes [B] int64. Device ops only: no host reads
and no shape that depends on a tensor's values, or the capture fails."""


def frame_codes(
    predictor: CodePredictor,
    code0_embedding: nn.Embedding,
    hidden: torch.Tensor,
    code0: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor,
    sample_fn: FrameSampleFn,
    caches: KVCaches | None = None,
) -> torch.Tensor:
    """Codebooks 1..15 [B, 15] of B frames from plain tensors: what a bucket's graph
    records, and the eager path. Equals `Talker.complete_frames(...)[:, 1:]` (same clamp of
    code0 into the embedding table, same predictor)."""
    safe = code0.clamp(max=code0_embedding.num_embeddings - 1)
    emb0 = code0_embedding(safe)

    def sample(logits: torch.Tensor, g: int) -> torch.Tensor:
        return sample_fn(logits, g, seeds, counters, temperature)

    return predictor.predict(hidden, emb0, sample, caches)


class PredictorGraphs(BucketGraphs):
    """Bucketed CUDA graphs of `frame_codes`, captured lazily (or all at once with
    `capture_all`) into one memory pool shared by the buckets.

    The buckets share one set of static buffers of `max_batch` rows (a bucket of size k
    reads and writes rows [:k]), which is safe because replays run one at a time on one
    stream. Without CUDA, or with `capture=False`, the same buffers, padding and function
    run eagerly (the CPU tests and a kill switch exercise everything but the capture)."""

    label = "code-predictor frame"

    def __init__(
        self,
        predictor: CodePredictor,
        code0_embedding: nn.Embedding,
        sample_fn: FrameSampleFn,
        max_batch: int,
        buckets: Sequence[int] = BATCH_BUCKETS,
        capture: bool = True,
        warmup_iters: int = 2,
    ) -> None:
        self.predictor = predictor
        self.code0_embedding = code0_embedding
        self.sample_fn = sample_fn
        self.max_batch = max_batch
        weight = code0_embedding.weight
        super().__init__(weight.device, max_batch, buckets, capture, warmup_iters)
        self.dtype = weight.dtype
        dev = self.device
        n = max_batch
        groups = predictor.shape.num_code_groups
        self.hidden = torch.zeros(n, code0_embedding.embedding_dim, device=dev, dtype=self.dtype)
        self.code0 = torch.zeros(n, device=dev, dtype=torch.int64)
        self.seeds = torch.zeros(n, device=dev, dtype=torch.int64)
        self.counters = torch.zeros(n, device=dev, dtype=torch.int64)
        self.temperature = torch.zeros(n, device=dev, dtype=torch.float32)
        self.out = torch.zeros(n, groups - 1, device=dev, dtype=torch.int64)
        self.caches = predictor.new_caches(n, dev, self.dtype)
        # Build the RoPE tables now: building reads a value back to the host.
        predictor.rope_tables(dev, self.dtype)

    @torch.no_grad()
    def run(
        self,
        hidden: torch.Tensor,
        code0: torch.Tensor,
        seeds: torch.Tensor,
        counters: torch.Tensor,
        temperature: torch.Tensor,
    ) -> torch.Tensor:
        """Codes 1..15 [B, 15] int64 of B frames, as a new tensor (a clone of the static
        output: the next replay overwrites it). hidden [B, H]; code0, seeds, counters [B];
        temperature [B] (the subtalker's, 0 for greedy rows)."""
        b = hidden.shape[0]
        rows = {"code0": code0, "seeds": seeds, "counters": counters, "temperature": temperature}
        for name, t in rows.items():
            if t.shape != (b,):
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({b},)")
        k = self.bucket_for(b)
        if k is None:
            return self._codes((hidden, code0, seeds, counters, temperature))
        self._load(b, k, hidden, code0, seeds, counters, temperature)
        self._compute(k)
        return self.out[:b].clone()

    def _load(
        self,
        b: int,
        k: int,
        hidden: torch.Tensor,
        code0: torch.Tensor,
        seeds: torch.Tensor,
        counters: torch.Tensor,
        temperature: torch.Tensor,
    ) -> None:
        """Rows [:b] from the inputs, rows [b:k] the padding (greedy, zero state)."""
        pairs = (
            (self.hidden, hidden),
            (self.code0, code0),
            (self.seeds, seeds),
            (self.counters, counters),
            (self.temperature, temperature),
        )
        for buf, src in pairs:
            buf[:b].copy_(src)
            if b < k:
                buf[b:k].zero_()

    def _step(self, k: int) -> None:
        """Bucket k's computation over the static buffers (what its graph records)."""
        rows = (self.hidden, self.code0, self.seeds, self.counters, self.temperature)
        caches = [(kc[:k], vc[:k]) for kc, vc in self.caches]
        self.out[:k].copy_(self._codes(tuple(t[:k] for t in rows), caches))

    def _codes(
        self, rows: tuple[torch.Tensor, ...], caches: KVCaches | None = None
    ) -> torch.Tensor:
        """`frame_codes` of rows (hidden, code0, seeds, counters, temperature) with this
        object's predictor, embedding and sampler: a bucket's step over the static buffers
        (and their caches), or a batch above the largest bucket (fresh caches)."""
        return frame_codes(self.predictor, self.code0_embedding, *rows, self.sample_fn, caches)
