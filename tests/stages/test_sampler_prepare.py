"""`SamplingStaging.prepare` builds exactly the batch the per-row construction built, and the
draws are bit-identical (same counter-hash noise, same order of operations)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omniflow.core.request import SamplingParams
from omniflow.models.interface import TokenPolicy
from omniflow.stages.sampler import BatchSampler, SamplingBatch, SamplingStaging, sample

VOCAB = 3072
EOS = 2150
POLICY = TokenPolicy(
    vocab_size=VOCAB,
    suppressed_ids=tuple(i for i in range(VOCAB - 1024, VOCAB) if i != EOS),
    fallback_stop_ids=(EOS,),
)


@dataclass
class Row:
    sampling: SamplingParams
    seed: int
    tokens: list[int] = field(default_factory=list)


def per_row_batch(rows: list[Row]) -> SamplingBatch:
    """The construction the runner used before `prepare` (one tensor per field from lists,
    bans and history from the rows)."""
    sp = [r.sampling for r in rows]
    suppress = torch.zeros(VOCAB, dtype=torch.bool)
    suppress[list(POLICY.suppressed_ids)] = True
    banned = suppress.expand(len(rows), -1).clone()
    ban_rows: list[int] = []
    ids: list[int] = []
    for i, (r, s) in enumerate(zip(rows, sp, strict=True)):
        extra = list(s.suppress_token_ids)
        if s.ignore_eos or len(r.tokens) < s.min_new_tokens:
            extra += list(s.stop_token_ids) or [EOS]
        ban_rows.extend([i] * len(extra))
        ids.extend(extra)
    if ban_rows:
        banned[torch.tensor(ban_rows), torch.tensor(ids)] = True
    return SamplingBatch(
        temperature=torch.tensor([s.temperature for s in sp]),
        top_k=torch.tensor([s.top_k for s in sp], dtype=torch.int64),
        top_p=torch.tensor([s.top_p for s in sp]),
        repetition_penalty=torch.tensor([s.repetition_penalty for s in sp]),
        seeds=torch.tensor([r.seed for r in rows], dtype=torch.int64),
        counters=torch.tensor([len(r.tokens) for r in rows], dtype=torch.int64),
        history=tuple(tuple(r.tokens) for r in rows),
        banned=banned,
        top_k_max=max(s.top_k for s in sp) if all(s.top_k > 0 for s in sp) else 0,
        use_top_p=any(s.top_p < 1.0 for s in sp),
        use_penalty=any(s.repetition_penalty != 1.0 for s in sp),
    )


def per_row_sub_batch(batch: SamplingBatch, idx: torch.Tensor) -> SamplingBatch:
    """The code predictor's batch as a general `SamplingBatch` (the runner's first form)."""
    n = len(idx)
    return SamplingBatch(
        temperature=torch.where(
            batch.temperature[idx] > 0,
            torch.full_like(batch.temperature[idx], 0.9),
            torch.zeros_like(batch.temperature[idx]),
        ),
        top_k=torch.full((n,), 50, dtype=torch.int64),
        top_p=torch.ones(n),
        repetition_penalty=torch.ones(n),
        seeds=batch.seeds[idx],
        counters=batch.counters[idx],
        top_k_max=50,
        use_top_p=False,
        use_penalty=False,
    )


def rows() -> list[Row]:
    g = torch.Generator().manual_seed(0)
    hist = torch.randint(0, 2048, (40,), generator=g).tolist()
    return [
        Row(SamplingParams(stop_token_ids=(EOS,)), seed=1),  # EOS held back (min 2)
        Row(SamplingParams(min_new_tokens=3), seed=2, tokens=[5, 5]),  # no stop ids: fallback
        Row(SamplingParams(ignore_eos=True, stop_token_ids=(7, 9)), seed=3, tokens=[1, 2, 3]),
        Row(SamplingParams(suppress_token_ids=(1, 2, 3), min_new_tokens=0), seed=4, tokens=hist),
        Row(SamplingParams(temperature=0.0, top_k=0, repetition_penalty=1.3), seed=5, tokens=hist),
        Row(SamplingParams(top_p=0.8, repetition_penalty=1.0), seed=2**62 + 7, tokens=[9] * 12),
        Row(SamplingParams(temperature=0.7, top_k=300), seed=-11, tokens=hist[:7]),
    ]


def assert_same_fields(new: SamplingBatch, old: SamplingBatch) -> None:
    for name in ("temperature", "top_k", "top_p", "repetition_penalty", "seeds", "counters"):
        a, b = getattr(new, name), getattr(old, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert torch.equal(new.banned, old.banned)
    assert (new.top_k_max, new.use_top_p, new.use_penalty) == (
        old.top_k_max,
        old.use_top_p,
        old.use_penalty,
    )


def test_prepare_builds_the_per_row_batch_and_draws_the_same_ids():
    staging = SamplingStaging(16, POLICY, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    for subset in (rows(), rows()[:1], rows()[3:], rows()[::-1]):
        new, old = staging.prepare(subset), per_row_batch(subset)
        assert_same_fields(new, old)
        pairs = new.penalty_pairs
        assert pairs is not None
        expanded = [(i, t) for i, r in enumerate(subset) for t in sorted(set(r.tokens))]
        assert list(zip(pairs[0].tolist(), pairs[1].tolist(), strict=True)) == expanded
        for stream in (0, 1, 7):
            logits = torch.randn(len(subset), VOCAB, generator=g) * 4
            assert torch.equal(sample(logits, new, stream), sample(logits, old, stream))


def test_fixed_policy_equals_the_per_row_sub_batch():
    """`with_policy` keeps the rows' seeds and counters, sets the policy's temperature where
    a row samples, and draws what the general sampler draws under that policy (continuous
    logits: no ties at the k-th value, where the fixed policy keeps every tied id)."""
    staging = SamplingStaging(16, POLICY, torch.device("cpu"))
    subset = rows()
    new, old = staging.prepare(subset), per_row_batch(subset)
    g = torch.Generator().manual_seed(2)
    for idx in (torch.arange(len(subset)), torch.tensor([0, 2, 4, 5])):
        full = len(idx) == len(subset)
        sub_new = BatchSampler(new).with_policy(None if full else idx, 0.9, 50)
        sub_old = per_row_sub_batch(old, idx)
        for name, got in zip(
            ("seeds", "counters", "temperature"), sub_new.noise_keys(), strict=True
        ):
            want = getattr(sub_old, name)
            assert got.dtype == want.dtype and torch.equal(got, want), name
        assert sub_new.top_k == 50
        for stream in range(1, 16):
            logits = torch.randn(len(idx), 2048, generator=g) * 3
            assert torch.equal(sub_new.draw(logits, stream), sample(logits, sub_old, stream))


def test_staging_is_reused_and_grows_for_long_histories():
    staging = SamplingStaging(4, POLICY, torch.device("cpu"))
    before = staging.seeds.dev.data_ptr()
    long = [
        Row(SamplingParams(repetition_penalty=1.2), seed=i, tokens=list(range(900)))
        for i in range(3)
    ]
    new = staging.prepare(long)
    assert staging.seeds.dev.data_ptr() == before  # the fixed-address device buffer
    assert new.penalty_pairs is not None and new.penalty_pairs[0].shape[0] == 2700
    assert_same_fields(new, per_row_batch(long))
