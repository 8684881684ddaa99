"""The sampler: filters, penalties, and the counter-based per-request randomness."""

from __future__ import annotations

import dataclasses

import torch

from omniflow.sampling.draw import SamplingBatch, sample, uniform_noise


def batch(b: int, **kw) -> SamplingBatch:
    base = dict(
        temperature=torch.ones(b),
        top_k=torch.zeros(b, dtype=torch.int64),
        top_p=torch.ones(b),
        repetition_penalty=torch.ones(b),
        seeds=torch.arange(b, dtype=torch.int64) + 7,
        counters=torch.zeros(b, dtype=torch.int64),
    )
    base.update(kw)
    return SamplingBatch(**base)


def test_noise_depends_only_on_seed_counter_stream():
    seeds = torch.tensor([1, 2, 1], dtype=torch.int64)
    counters = torch.tensor([5, 5, 5], dtype=torch.int64)
    u = uniform_noise(seeds, counters, 0, 64)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert not torch.equal(u[0], uniform_noise(seeds, counters + 1, 0, 64)[0])
    assert not torch.equal(u[0], uniform_noise(seeds, counters, 1, 64)[0])
    assert float(u.min()) > 0 and float(u.max()) < 1
    # a row's noise does not depend on the other rows
    assert torch.equal(uniform_noise(seeds[:1], counters[:1], 0, 64)[0], u[0])


def test_noise_is_roughly_uniform():
    u = uniform_noise(
        torch.arange(64, dtype=torch.int64), torch.zeros(64, dtype=torch.int64), 0, 4096
    )
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert torch.all((hist - 0.1).abs() < 0.01)


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    logits = probs.clamp_min(1e-12).log().expand(4000, -1)
    b = batch(4000, seeds=torch.arange(4000, dtype=torch.int64))
    counts = torch.bincount(sample(logits, b), minlength=4).float() / 4000
    assert torch.allclose(counts, probs, atol=0.03)


def test_greedy_top_k_1_and_banned():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]] * 3)
    assert sample(logits, batch(3, temperature=torch.zeros(3))).tolist() == [1, 1, 1]
    assert sample(logits, batch(3, top_k=torch.ones(3, dtype=torch.int64))).tolist() == [1] * 3
    banned = torch.zeros(3, 4, dtype=torch.bool)
    banned[:, 1] = True
    out = sample(logits, batch(3, temperature=torch.zeros(3), banned=banned))
    assert out.tolist() == [3, 3, 3]


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    logits = probs.log().expand(2000, -1)
    b = batch(2000, seeds=torch.arange(2000, dtype=torch.int64), top_p=torch.full((2000,), 0.8))
    out = sample(logits, b)
    assert set(out.tolist()) == {0, 1}


def test_repetition_penalty_hf_semantics():
    logits = torch.tensor([[2.0, 2.0, -1.0]])
    b = batch(
        1, temperature=torch.zeros(1), repetition_penalty=torch.tensor([4.0]), history=((0,),)
    )
    assert sample(logits, b).tolist() == [1]  # 2/4 < 2
    b2 = batch(
        1, temperature=torch.zeros(1), repetition_penalty=torch.tensor([4.0]), history=((0, 1),)
    )
    assert sample(torch.tensor([[2.0, 1.0, 0.6]]), b2).tolist() == [2]
    b3 = batch(
        1, temperature=torch.zeros(1), repetition_penalty=torch.tensor([4.0]), history=((1,),)
    )
    assert sample(torch.tensor([[-1.0, -0.5]]), b3).tolist() == [0]  # -0.5 * 4 < -1


def test_a_rows_draw_does_not_depend_on_its_batch_mates_top_p():
    """Tied logits (ties at the k-th value) and greedy rows: each top_p = 1 row draws the same
    alone and beside top_p < 1 rows, and each top_p < 1 row the same alone and beside
    top_p = 1 rows, with penalties and bans on."""
    g = torch.Generator().manual_seed(0)
    n = 64
    logits = torch.randint(-3, 3, (n, 300), generator=g).float() / 2
    top_p = torch.where(torch.arange(n) % 2 == 0, 1.0, 0.7)
    b = batch(
        n,
        seeds=torch.arange(n, dtype=torch.int64) * 7919,
        counters=torch.arange(n, dtype=torch.int64),
        top_k=torch.randint(1, 40, (n,), generator=g),
        top_p=top_p,
        temperature=torch.where(torch.arange(n) % 3 == 0, 0.0, 0.8),
        repetition_penalty=torch.full((n,), 1.3),
        seen=torch.rand(n, 300, generator=g) < 0.2,
        banned=torch.rand(n, 300, generator=g) < 0.05,
        use_top_p=True,
    )
    mixed = sample(logits, b, stream=3)
    for parity in (0, 1):
        rows = torch.arange(parity, n, 2)
        alone = dataclasses.replace(
            b,
            **{
                f: getattr(b, f)[rows]
                for f in (
                    "temperature",
                    "top_k",
                    "top_p",
                    "repetition_penalty",
                    "seeds",
                    "counters",
                    "seen",
                    "banned",
                )
            },
            use_top_p=parity == 1,
        )
        assert torch.equal(sample(logits[rows], alone, stream=3), mixed[rows]), parity
    # The nucleus acted on the top_p < 1 rows: without the cut some of them draw otherwise.
    uncut = sample(logits, dataclasses.replace(b, top_p=torch.ones(n)), stream=3)
    assert not torch.equal(uncut[1::2], mixed[1::2])


def test_sample_keeps_ties_at_the_kth_value_on_both_paths():
    """k=2 over [5, 4, 4, 4, 1, ...]: ids 0..3 are drawn, whether or not the batch has a
    top_p < 1 row (the nucleus path, here with top_p 0.999 that cuts nothing of them)."""
    rows = 400
    logits = torch.ones(rows, 64)
    logits[:, 0] = 5.0
    logits[:, 1:4] = 4.0
    for top_p in (1.0, 0.999):
        b = batch(
            rows,
            seeds=torch.arange(rows, dtype=torch.int64),
            top_k=torch.full((rows,), 2, dtype=torch.int64),
            temperature=torch.full((rows,), 3.0),
            top_p=torch.full((rows,), top_p),
            use_top_p=top_p < 1,
        )
        assert set(sample(logits, b, stream=1).tolist()) == {0, 1, 2, 3}, top_p
