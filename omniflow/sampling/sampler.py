"""Builds each step's `SamplingBatch` and hands it to the model.

`SamplingStaging.prepare` fills a step's batch from persistent staging buffers (one in-place
fill and one copy per field) and keeps the rows' repetition-penalty history on the device;
`BatchSampler` is the batch as the model sees it (`models.interface.RowSampler`): the model
decides what to draw (codebook 0 with each request's settings, `stages/draw.sample`; the rest
of its frame under a fixed policy, `FixedPolicySampler`, one Triton launch per draw on CUDA).
The draws and their semantics are `sampling/draw.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from omniflow.core.request import SamplingParams
from omniflow.device.staging import Staging
from omniflow.models.interface import TokenPolicy
from omniflow.sampling.draw import SamplingBatch, draw_fixed_policy, sample
from omniflow.sampling.penalty import PenaltyHistory


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
    in-place fill and one copy per field, no per-row tensors (see `device/staging.py`)."""

    def __init__(
        self, max_rows: int, policy: TokenPolicy, device: torch.device, max_requests: int = 0
    ) -> None:
        """`max_rows`: rows of one sampling call; `max_requests`: requests whose penalty
        histories are kept at once (more than the rows when streams take turns; 0: rows)."""
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
        self.history = PenaltyHistory(policy.vocab_size, max(max_rows, max_requests), device)
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
            use_top_p=any(s.top_p < 1.0 for s in sp),
            use_penalty=use_penalty,
            seen=self.history.rows(slots) if use_penalty else None,
            history_slots=(slots, tuple(host_slots)),
        )
        self.staging.end()
        return batch

    def record(self, batch: SamplingBatch, ids: torch.Tensor) -> None:
        """The rows of `batch` (from `prepare`) sampled `ids` [B] (device): add them to the
        rows' penalty histories. Call once per `prepare`, after the draw, and before the next
        `prepare`: a batch's tensors are views of the staging's device buffers, which the next
        `prepare` overwrites (the window records a step at the top of its iteration, when its
        batch is still the last one prepared)."""
        if batch.history_slots is not None:
            slots, host = batch.history_slots
            self.history.record(slots, host, ids)

    def release(self, request_id: str) -> None:
        """The request left the runner: its history slot may be reused."""
        self.history.release(request_id)
