"""The draws themselves: one id per row from logits, with per-request reproducible noise.

Each request's randomness is a counter-based stream keyed by its seed: the uniform noise for
(seed, token index, codebook, vocabulary id) is a fixed integer hash. This is the request's
own generator in every sense that matters — same seed, same samples — and more: the draws
do not depend on batch composition, slot reuse, preemption or multi-step windows, there is
no generator state to save and restore, and one batched kernel serves every row (per-row
`torch.Generator` objects force a Python loop per sampling step).

Order of operations (as the Qwen3-TTS reference): repetition penalty, banned ids,
temperature, top-k, top-p, then a Gumbel-max draw (exactly a categorical sample). Top-k
keeps every id tied with the k-th largest value (Hugging Face's top-k warper); greedy rows
take the first maximum. A row's draw depends on its own settings only: a row without a
nucleus cut (top_p = 1) is drawn by `sample_top_k` (one Triton launch on CUDA) whatever its
batch-mates ask for, and a row with top_p < 1 by the nucleus path.

`sampling/sampler.py` builds the batches (`SamplingStaging`) and hands them to the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B  # < 2**27, so products of 32-bit values stay inside int64
U_MAX = 1.0 - 2.0**-24
"""The largest float32 below 1. The top hash value maps to (2**24 - 0.5) / 2**24, which
float32 rounds to exactly 1.0: its Gumbel noise would be +inf, and on a banned id (-inf)
the sum NaN, which `argmax` picks. One (seed, counter, id) in 2**24 has it (seed 31 drew a
suppressed id at counter 366 and the stage died). Clamped here and in the Triton kernel
alike, so the two draw the same ids; every other uniform is unchanged."""


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
    return (((h >> 8).to(torch.float32) + 0.5) / float(1 << 24)).clamp_(max=U_MAX)


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
    use_top_p: bool = True
    """Host-side hint: some row has top_p < 1 (False: every row takes `sample_top_k`, and
    the nucleus path is not computed at all)."""
    use_penalty: bool = True
    """Host-side hint: some row has a repetition penalty != 1."""
    seen: torch.Tensor | None = field(default=None)
    """[B, V] bool: the ids each row has sampled (what `history` lists), from the
    device-resident `PenaltyHistory`, so `sample` needs no host lists. None: derived from
    `history`."""
    history_slots: tuple[torch.Tensor, tuple[int, ...]] | None = field(default=None)
    """The rows' `PenaltyHistory` slots (device, host): where `SamplingStaging.record` marks
    the ids this call samples."""


def sample(logits: torch.Tensor, batch: SamplingBatch, stream: int = 0) -> torch.Tensor:
    """Sample one id per row of `logits` [B, V]: rows with top_p < 1 by the nucleus path,
    the others by `sample_top_k` (so a row's draw never depends on its batch-mates' top_p;
    without such rows, the Qwen3-TTS default, only `sample_top_k` runs)."""
    fast = sample_top_k(logits, batch, stream)
    if not batch.use_top_p:
        return fast
    return torch.where(batch.top_p < 1, sample_nucleus(logits, batch, stream), fast)


def sample_nucleus(logits: torch.Tensor, batch: SamplingBatch, stream: int) -> torch.Tensor:
    """The general draw for rows with a nucleus cut: penalty, bans and temperature, the
    top-k candidates (ties at the k-th value kept), then the smallest prefix of them, in
    descending order (a stable sort: ties by id), whose mass before each id is <= top_p, and
    a Gumbel-max draw over what is left; greedy rows take the first maximum. Rows with
    top_p >= 1 are not cut (their float mass may round past 1)."""
    x = _penalised_banned(logits, batch, _seen(batch, logits))
    greedy = batch.temperature <= 0
    temp = torch.where(greedy, torch.ones_like(batch.temperature), batch.temperature)
    x = x / temp[:, None]
    v = x.shape[1]
    ordered, order = x.sort(dim=-1, descending=True, stable=True)
    kth = ordered.gather(1, (_row_k(batch.top_k, v) - 1)[:, None])
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    probs = ordered.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs
    cut = (before > batch.top_p[:, None]) & (batch.top_p < 1)[:, None]
    ordered = ordered.masked_fill(cut, float("-inf"))
    u = uniform_noise_at(batch.seeds, batch.counters, stream, order)
    choice = torch.argmax(ordered - torch.log(-torch.log(u)), dim=-1)
    choice = torch.where(greedy, torch.zeros_like(choice), choice)
    return order.gather(1, choice[:, None]).squeeze(1)


def sample_top_k(logits: torch.Tensor, batch: SamplingBatch, stream: int = 0) -> torch.Tensor:
    """One id per row without a nucleus cut (top_p is not read): repetition penalty, banned
    ids, then `fixed_policy_torch`'s draw with each row's own temperature and top_k (ties at
    the k-th value stay candidates; greedy rows take the first maximum). On CUDA one Triton
    launch (`kernels.topk_sample.sample_rows`) instead of about a hundred torch ops, which at
    batch 1 kept the host busier than the GPU."""
    seen = _seen(batch, logits)
    if logits.is_cuda:
        # Imported here: Triton is needed on CUDA machines only.
        from omniflow.kernels.topk_sample import sample_rows

        penalty = batch.repetition_penalty.float() if seen is not None else None
        return sample_rows(
            logits,
            batch.seeds,
            batch.counters,
            batch.temperature.float(),
            stream,
            batch.top_k,
            seen,
            penalty,
            batch.banned,
        )
    x = _penalised_banned(logits, batch, seen)
    b = batch
    return fixed_policy_torch(x, stream, b.seeds, b.counters, b.temperature, b.top_k)


def _seen(batch: SamplingBatch, logits: torch.Tensor) -> torch.Tensor | None:
    """[B, V] bool: the ids the repetition penalty applies to, or None when no row has a
    penalty (or nothing was sampled yet): the batch's device mask, else built from `history`."""
    if not batch.use_penalty or (batch.seen is None and not batch.history):
        return None
    if batch.seen is not None:
        return batch.seen
    seen = torch.zeros(logits.shape, dtype=torch.bool)
    for row, ids in enumerate(batch.history):
        if ids:
            seen[row, list(ids)] = True
    return seen.to(logits.device)


def _penalised_banned(
    logits: torch.Tensor, batch: SamplingBatch, seen: torch.Tensor | None
) -> torch.Tensor:
    """fp32 logits with the repetition penalty on the `seen` ids (None: none) and the
    batch's banned ids at -inf: what both torch draws start from."""
    x = logits.float()
    if seen is not None:
        x = _penalise(x, seen, batch.repetition_penalty)
    if batch.banned is not None:
        x = x.masked_fill(batch.banned, float("-inf"))
    return x


def _row_k(top_k: torch.Tensor, v: int) -> torch.Tensor:
    """Each row's number of top-k candidates: its top_k, or all V ids for k <= 0 or >= V."""
    return torch.where((top_k > 0) & (top_k < v), top_k, torch.full_like(top_k, v))


def _penalise(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """HF semantics: a seen id's logit is divided by the penalty if positive, else multiplied
    (a penalty of 1 leaves its row unchanged)."""
    p = penalty.to(logits.dtype)[:, None]
    penalised = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, penalised, logits)


def fixed_policy_torch(
    logits: torch.Tensor,
    stream: int,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor,
    top_k: int | torch.Tensor,
) -> torch.Tensor:
    """The fixed policy's draw in torch: scaled = logits / temperature (1 where greedy); the
    candidates are the ids >= the k-th largest scaled logit (ties at the k-th value all stay
    in, as Hugging Face's top-k warper keeps them); argmax of scaled + Gumbel noise over them
    (greedy rows: argmax of scaled); ties to the lowest id. `top_k` is one k for every row or
    [B] (each row's own); k <= 0 or >= V: every id. The CPU path, and the oracle of the CUDA
    kernel (`omniflow.kernels.topk_sample`)."""
    scaled = logits.float()
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = scaled / temp[:, None]
    v = scaled.shape[1]
    if isinstance(top_k, torch.Tensor):
        k = _row_k(top_k, v)
        kth = scaled.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    elif 0 < top_k < v:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    noise = -torch.log(-torch.log(uniform_noise(seeds, counters, stream, v)))
    score = torch.where(greedy[:, None], scaled, scaled + noise)
    return score.argmax(dim=-1)


def draw_fixed_policy(
    logits: torch.Tensor,
    stream: int,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor,
    *,
    top_k: int,
) -> torch.Tensor:
    """One draw per row under one fixed policy (`fixed_policy_torch`), from tensors alone:
    device ops only, so a CUDA graph can hold it (the code predictor's frame graph). On CUDA
    one Triton launch (`omniflow.kernels.topk_sample`) instead of about fifty torch ops."""
    if logits.is_cuda:
        # Imported here: Triton is needed on CUDA machines only.
        from omniflow.kernels.topk_sample import topk_sample

        return topk_sample(logits, seeds, counters, temperature, stream, top_k)
    return fixed_policy_torch(logits, stream, seeds, counters, temperature, top_k)
