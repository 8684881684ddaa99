"""Batched sampling with per-request reproducible randomness.

Each request's randomness is a counter-based stream keyed by its seed: the uniform noise for
(seed, token index, codebook, vocabulary id) is a fixed integer hash. This is the request's
own generator in every sense that matters — same seed, same samples — and more: the draws
do not depend on batch composition, slot reuse, preemption or multi-step windows, there is
no generator state to save and restore, and one batched kernel serves every row (per-row
`torch.Generator` objects force a Python loop per sampling step).

Order of operations (as the Qwen3-TTS reference): repetition penalty, banned ids,
temperature, top-k, top-p, then a Gumbel-max draw (exactly a categorical sample).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B  # < 2**27, so products of 32-bit values stay inside int64


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (values in [0, 2**32) held in int64)."""
    x = (x ^ (x >> 16)) * _MUL & _M32
    x = (x ^ (x >> 16)) * _MUL & _M32
    return x ^ (x >> 16)


def uniform_noise(
    seeds: torch.Tensor, counters: torch.Tensor, stream: int, vocab: int
) -> torch.Tensor:
    """[B, vocab] uniforms in (0, 1) determined by (seed, counter, stream, column)."""
    cols = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    return uniform_noise_at(seeds, counters, stream, cols[None, :].expand(len(seeds), -1))


def uniform_noise_at(
    seeds: torch.Tensor, counters: torch.Tensor, stream: int, ids: torch.Tensor
) -> torch.Tensor:
    """The same uniforms as `uniform_noise`, only at vocabulary ids `ids` [B, k]."""
    lo = seeds & _M32
    hi = (seeds >> 32) & _M32
    base = _mix(lo ^ _mix((hi + 0x9E3779B) & _M32))
    base = _mix(base ^ _mix((counters * 0x27D4EB2 + stream * 0x165667B1 + 1) & _M32))
    h = _mix(base[:, None] ^ _mix(ids + 0x5BD1E99))
    return ((h >> 8).to(torch.float32) + 0.5) / float(1 << 24)


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row sampling settings for one call."""

    temperature: torch.Tensor
    """[B] float; 0 means greedy."""
    top_k: torch.Tensor
    """[B] int64; 0 disables."""
    top_p: torch.Tensor
    """[B] float in (0, 1]."""
    repetition_penalty: torch.Tensor
    """[B] float; 1 disables."""
    seeds: torch.Tensor
    """[B] int64."""
    counters: torch.Tensor
    """[B] int64: the index of the token being sampled in its request's output."""
    history: tuple[tuple[int, ...], ...] = ()
    """Per row, the tokens the repetition penalty applies to."""
    banned: torch.Tensor | None = None
    """[B, V] bool: ids that must not be sampled (suppressed, or stop ids held back)."""
    top_k_max: int = 0
    """Host-side hint: the largest top_k when every row has one (then only the top
    candidates are sorted and drawn); 0 when some row samples the whole vocabulary."""
    use_top_p: bool = True
    """Host-side hint: some row has top_p < 1 (False skips the nucleus cut)."""
    use_penalty: bool = True
    """Host-side hint: some row has a repetition penalty != 1."""


FAST_TOP_K = 256
"""Largest top_k served by the candidate path (top-k, then noise for those ids only)."""


def sample(logits: torch.Tensor, batch: SamplingBatch, stream: int = 0) -> torch.Tensor:
    """Sample one id per row of `logits` [B, V]."""
    logits = logits.float()
    b, v = logits.shape
    if batch.history and batch.use_penalty:
        logits = _apply_penalty(logits, batch)
    if batch.banned is not None:
        logits = logits.masked_fill(batch.banned, float("-inf"))
    greedy = batch.temperature <= 0
    temp = torch.where(greedy, torch.ones_like(batch.temperature), batch.temperature)
    logits = logits / temp[:, None]
    if 0 < batch.top_k_max <= min(FAST_TOP_K, v):
        # Only the top candidates can be drawn: sort and draw noise for those ids alone.
        ordered, order = logits.topk(batch.top_k_max, dim=-1)
        width = batch.top_k_max
    else:
        ordered, order = logits.sort(dim=-1, descending=True, stable=True)
        width = v
    rank = torch.arange(width, device=logits.device)[None, :]
    k = torch.where(batch.top_k > 0, batch.top_k, torch.full_like(batch.top_k, v))
    ordered = ordered.masked_fill(rank >= k[:, None], float("-inf"))
    if batch.use_top_p:
        probs = ordered.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs
        ordered = ordered.masked_fill(before > batch.top_p[:, None], float("-inf"))
    u = uniform_noise_at(batch.seeds, batch.counters, stream, order)
    gumbel = -torch.log(-torch.log(u))
    choice = torch.argmax(ordered + gumbel, dim=-1)
    choice = torch.where(greedy, torch.zeros_like(choice), choice)
    return order.gather(1, choice[:, None]).squeeze(1)


def _apply_penalty(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """HF semantics: a seen id's logit is divided by the penalty if positive, else multiplied.
    All rows at once: the (row, id) pairs are laid out on the host and applied in one gather
    and one scatter (a penalty of 1 leaves its row unchanged)."""
    rows: list[int] = []
    ids: list[int] = []
    for row, seen in enumerate(batch.history):
        unique = sorted(set(seen))
        rows.extend([row] * len(unique))
        ids.extend(unique)
    if not rows:
        return logits
    r = torch.tensor(rows, device=logits.device, dtype=torch.int64)
    i = torch.tensor(ids, device=logits.device, dtype=torch.int64)
    vals = logits[r, i]
    p = batch.repetition_penalty.to(logits.dtype)[r]
    logits = logits.clone()
    logits[r, i] = torch.where(vals > 0, vals / p, vals * p)
    return logits
