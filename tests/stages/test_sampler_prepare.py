"""`SamplingStaging.prepare` builds exactly the batch the per-row construction built, and the
draws are bit-identical (same counter-hash noise, same order of operations)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from omniflow.core.request import SamplingParams
from omniflow.models.interface import TokenPolicy
from omniflow.sampling.draw import SamplingBatch, sample
from omniflow.sampling.sampler import BatchSampler, SamplingStaging

VOCAB = 3072
EOS = 2150
POLICY = TokenPolicy(
    vocab_size=VOCAB,
    suppressed_ids=tuple(i for i in range(VOCAB - 1024, VOCAB) if i != EOS),
    fallback_stop_ids=(EOS,),
    frameless_ids=(EOS,),
)


_ids = itertools.count()


@dataclass
class Row:
    sampling: SamplingParams
    seed: int
    tokens: list[int] = field(default_factory=list)
    request_id: str = field(default_factory=lambda: f"row{next(_ids)}")


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
    assert (new.use_top_p, new.use_penalty) == (old.use_top_p, old.use_penalty)


def test_prepare_builds_the_per_row_batch_and_draws_the_same_ids():
    staging = SamplingStaging(16, POLICY, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    for subset in (rows(), rows()[:1], rows()[3:], rows()[::-1]):
        new, old = staging.prepare(subset), per_row_batch(subset)
        assert_same_fields(new, old)
        assert new.seen is not None
        for i, r in enumerate(subset):
            assert set(new.seen[i].nonzero().flatten().tolist()) == set(r.tokens)
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
    assert new.seen is not None and int(new.seen.sum()) == 2700
    assert_same_fields(new, per_row_batch(long))


def test_penalty_history_follows_each_step_on_the_device_without_rebuilding(monkeypatch):
    """After the first step a row's mask is updated by `record` alone (a rebuild would fail
    here), draws equal the per-row construction's at every step, and a slot freed by one
    request is reused clean by the next."""
    staging = SamplingStaging(2, POLICY, torch.device("cpu"))
    sp = SamplingParams(repetition_penalty=1.3, top_k=0, temperature=0.7)
    live = [Row(sp, seed=5, tokens=[3, 3, 40]), Row(sp, seed=6)]
    staging.prepare(live)  # first sight: each row is built from its tokens once
    history = staging.history

    def no_rebuild(slot, tokens):
        raise AssertionError("rebuilt from the host")

    monkeypatch.setattr(history, "_rebuild", no_rebuild)
    g = torch.Generator().manual_seed(3)
    for step in range(6):
        new, old = staging.prepare(live), per_row_batch(live)
        assert new.seen is not None
        for i, r in enumerate(live):
            assert set(new.seen[i].nonzero().flatten().tolist()) == set(r.tokens), step
        logits = torch.randn(2, VOCAB, generator=g) * 4
        ids = sample(logits, new, 0)
        assert torch.equal(ids, sample(logits, old, 0)), step
        staging.record(new, ids)
        for r, t in zip(live, ids.tolist(), strict=True):
            r.tokens.append(t)
    monkeypatch.undo()
    slot = history.slot_of[live[0].request_id]
    staging.release(live[0].request_id)
    newcomer = Row(sp, seed=9)
    batch = staging.prepare([newcomer, live[1]])
    assert history.slot_of[newcomer.request_id] == slot
    assert batch.seen is not None and not batch.seen[0].any()


def test_penalty_history_rebuilds_a_row_whose_tokens_changed_elsewhere_and_grows():
    staging = SamplingStaging(1, POLICY, torch.device("cpu"))
    sp = SamplingParams(repetition_penalty=1.3)
    row = Row(sp, seed=1, tokens=[7])
    staging.prepare([row])
    row.tokens[:] = [8, 9]  # e.g. re-admitted with other tokens: the count differs
    batch = staging.prepare([row])
    assert batch.seen is not None and batch.seen[0].nonzero().flatten().tolist() == [8, 9]
    others = [Row(sp, seed=i, tokens=[i]) for i in range(3)]  # more requests than slots
    for other in others:
        staging.prepare([other])
    assert len(staging.history.slot_of) == 4 and staging.history.seen.shape[0] >= 4
