"""Batched sampling with per-request reproducible randomness.

Each request's randomness is a counter-based stream keyed by its seed: the uniform noise for
(seed, token index, codebook, vocabulary id) is a fixed integer hash. This is the request's
own generator in every sense that matters — same seed, same samples — and more: the draws
do not depend on batch composition, slot reuse, preemption or multi-step windows, there is
no generator state to save and restore, and one batched kernel serves every row (per-row
`torch.Generator` objects force a Python loop per sampling step).

Order of operations (as the Qwen3-TTS reference): repetition penalty, banned ids,
temperature, top-k, top-p, then a Gumbel-max draw (exactly a categorical sample).

`SamplingStaging.prepare` builds a step's `SamplingBatch` from persistent staging buffers;
`BatchSampler` hands it to the model, which decides what to draw (the AR token, then the rest
of its frame under a fixed policy: `FixedPolicySampler`, one Triton launch per draw on CUDA).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from omniflow.core.request import SamplingParams
from omniflow.models.interface import TokenPolicy
from omniflow.stages.penalty import PenaltyHistory
from omniflow.stages.staging import Staging

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
    seen: torch.Tensor | None = field(default=None)
    """[B, V] bool: the ids each row has sampled (what `history` lists), from the
    device-resident `PenaltyHistory`, so `sample` needs no host lists. None: derived from
    `history`."""
    history_slots: tuple[torch.Tensor, tuple[int, ...]] | None = field(default=None)
    """The rows' `PenaltyHistory` slots (device, host): where `SamplingStaging.record` marks
    the ids this call samples."""


FAST_TOP_K = 256
"""Largest top_k served by the candidate path (top-k, then noise for those ids only)."""


def sample(logits: torch.Tensor, batch: SamplingBatch, stream: int = 0) -> torch.Tensor:
    """Sample one id per row of `logits` [B, V]. Without a nucleus cut (no row has top_p < 1,
    the Qwen3-TTS default) this is `sample_top_k`: one launch on CUDA."""
    if not batch.use_top_p:
        return sample_top_k(logits, batch, stream)
    logits = logits.float()
    b, v = logits.shape
    seen = _seen(batch, logits)
    if seen is not None:
        logits = _penalise(logits, seen, batch.repetition_penalty)
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
    probs = ordered.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs
    ordered = ordered.masked_fill(before > batch.top_p[:, None], float("-inf"))
    u = uniform_noise_at(batch.seeds, batch.counters, stream, order)
    gumbel = -torch.log(-torch.log(u))
    choice = torch.argmax(ordered + gumbel, dim=-1)
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
    x = logits.float()
    if seen is not None:
        x = _penalise(x, seen, batch.repetition_penalty)
    if batch.banned is not None:
        x = x.masked_fill(batch.banned, float("-inf"))
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


def _penalise(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """HF semantics: a seen id's logit is divided by the penalty if positive, else multiplied
    (a penalty of 1 leaves its row unchanged)."""
    p = penalty.to(logits.dtype)[:, None]
    penalised = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, penalised, logits)


class BatchSampler:
    """A `SamplingBatch` as the model sees it (`models.interface.RowSampler`)."""

    def __init__(self, batch: SamplingBatch) -> None:
        self.batch = batch

    def draw(self, logits: torch.Tensor, stream: int) -> torch.Tensor:
        return sample(logits, self.batch, stream=stream)

    def with_policy(
        self, rows: torch.Tensor | None, temperature: float, top_k: int
    ) -> FixedPolicySampler:
        b = self.batch
        return _fixed(b.seeds, b.counters, b.temperature, rows, temperature, top_k)

    def noise_keys(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.batch.seeds, self.batch.counters, self.batch.temperature


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
        k = torch.where((top_k > 0) & (top_k < v), top_k, torch.full_like(top_k, v))
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


class FixedPolicySampler:
    """Rows' seeds and counters under one fixed policy (`RowSampler.with_policy`): what the
    code predictor draws codebooks 1..15 with, eagerly or inside its frame graph."""

    def __init__(
        self, seeds: torch.Tensor, counters: torch.Tensor, temperature: torch.Tensor, top_k: int
    ) -> None:
        self.seeds = seeds
        self.counters = counters
        self.temperature = temperature
        self.top_k = top_k

    def draw(self, logits: torch.Tensor, stream: int) -> torch.Tensor:
        return draw_fixed_policy(
            logits, stream, self.seeds, self.counters, self.temperature, top_k=self.top_k
        )

    def with_policy(
        self, rows: torch.Tensor | None, temperature: float, top_k: int
    ) -> FixedPolicySampler:
        return _fixed(self.seeds, self.counters, self.temperature, rows, temperature, top_k)

    def noise_keys(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.seeds, self.counters, self.temperature


def _fixed(
    seeds: torch.Tensor,
    counters: torch.Tensor,
    row_temperature: torch.Tensor,
    rows: torch.Tensor | None,
    temperature: float,
    top_k: int,
) -> FixedPolicySampler:
    """These rows (all, or the subset `rows`) under `temperature` where the row samples
    (greedy rows stay greedy) and `top_k`."""
    if rows is not None:
        seeds, counters, row_temperature = seeds[rows], counters[rows], row_temperature[rows]
    temp = torch.where(
        row_temperature > 0,
        torch.full_like(row_temperature, temperature),
        torch.zeros_like(row_temperature),
    )
    return FixedPolicySampler(seeds, counters, temp, top_k)


class SamplingRow(Protocol):
    """What `prepare` reads of a runner request."""

    sampling: SamplingParams
    seed: int
    tokens: list[int]
    """Tokens sampled so far: the next one's counter, and the penalty's history."""
    request_id: str
    """Keys the row's device-resident penalty history."""


class SamplingStaging:
    """Builds the `SamplingBatch` of one sampling call from persistent staging buffers: one
    in-place fill and one copy per field, no per-row tensors (see `stages/staging.py`)."""

    def __init__(self, max_rows: int, policy: TokenPolicy, device: torch.device) -> None:
        self.policy = policy
        self.device = device
        self.staging = st = Staging(device)
        self.temperature = st.buffer((max_rows,), torch.float32)
        self.top_k = st.buffer((max_rows,), torch.int64)
        self.top_p = st.buffer((max_rows,), torch.float32)
        self.penalty = st.buffer((max_rows,), torch.float32)
        self.seeds = st.buffer((max_rows,), torch.int64)
        self.counters = st.buffer((max_rows,), torch.int64)
        self.bans = st.buffer((64, 2), torch.int64)
        """(row, id) pairs banned on top of the suppressed ids."""
        self.slots = st.buffer((max_rows,), torch.int64)
        """Each row's `PenaltyHistory` slot."""
        self.history = PenaltyHistory(policy.vocab_size, max_rows, device)
        self.suppress = torch.zeros(policy.vocab_size, dtype=torch.bool, device=device)
        self.suppress[list(policy.suppressed_ids)] = True

    def prepare(self, rows: Sequence[SamplingRow], pending: int = 0) -> SamplingBatch:
        """The batch for these rows' next token: their settings, seeds and counters, the
        model's suppressed ids plus each row's own bans (its suppressed ids; its stop ids,
        or the model's fallback, while it may not stop), and the rows' penalty-history masks.

        `pending`: tokens every row has sampled (and `record`ed) beyond its `tokens` list, not
        yet read back by the host (a window queues step n+1's draw before it reads step n):
        the counters, the min-new-tokens bans and the history's count take them into
        account, so the batch is the one the host would build after reading them."""
        b = len(rows)
        if b > self.temperature.capacity:
            raise ValueError(f"{b} rows to sample; staging holds {self.temperature.capacity}")
        sp = [r.sampling for r in rows]
        self.staging.begin()
        ban_pairs: list[tuple[int, int]] = []
        for i, (r, s) in enumerate(zip(rows, sp, strict=True)):
            self.temperature.np[i] = s.temperature
            self.top_k.np[i] = s.top_k
            self.top_p.np[i] = s.top_p
            self.penalty.np[i] = s.repetition_penalty
            try:
                self.seeds.np[i] = r.seed
            except OverflowError as exc:  # as torch.tensor would: a ValueError, not a crash
                raise ValueError(f"seed {r.seed} does not fit in int64") from exc
            count = len(r.tokens) + pending
            self.counters.np[i] = count
            extra = list(s.suppress_token_ids)
            if s.ignore_eos or count < s.min_new_tokens:
                extra += list(s.stop_token_ids) or list(self.policy.fallback_stop_ids)
            ban_pairs.extend((i, t) for t in extra)
        use_penalty = any(s.repetition_penalty != 1.0 for s in sp)
        banned = self.suppress.expand(b, -1).clone()
        if ban_pairs:
            self.bans = self.staging.grown(self.bans, len(ban_pairs))
            self.bans.np[: len(ban_pairs)] = ban_pairs
            pairs = self.bans.upload(len(ban_pairs))
            # The device's True (`PenaltyHistory.true`): a host scalar would sync.
            banned.index_put_((pairs[:, 0], pairs[:, 1]), self.history.true)
        # The history is kept for every row (one scatter per step), so a request's mask is
        # current whenever a penalty is asked for.
        host_slots = self.history.slots(rows, pending)
        self.slots.np[:b] = host_slots
        slots = self.slots.upload(b)
        batch = SamplingBatch(
            temperature=self.temperature.upload(b),
            top_k=self.top_k.upload(b),
            top_p=self.top_p.upload(b),
            repetition_penalty=self.penalty.upload(b),
            seeds=self.seeds.upload(b),
            counters=self.counters.upload(b),
            banned=banned,
            top_k_max=max(s.top_k for s in sp) if all(s.top_k > 0 for s in sp) else 0,
            use_top_p=any(s.top_p < 1.0 for s in sp),
            use_penalty=use_penalty,
            seen=self.history.rows(slots) if use_penalty else None,
            history_slots=(slots, tuple(host_slots)),
        )
        self.staging.end()
        return batch

    def record(self, batch: SamplingBatch, ids: torch.Tensor) -> None:
        """The rows of `batch` (from `prepare`) sampled `ids` [B] (device): add them to the
        rows' penalty histories. Call once per `prepare`, after the draw."""
        if batch.history_slots is not None:
            slots, host = batch.history_slots
            self.history.record(slots, host, ids)

    def release(self, request_id: str) -> None:
        """The request left the runner: its history slot may be reused."""
        self.history.release(request_id)
