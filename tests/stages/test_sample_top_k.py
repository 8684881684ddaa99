"""Codebook 0's draw without a nucleus cut (`sample_top_k`, one launch on CUDA): what it
keeps of the general sampler and where it differs (ties at the k-th value stay in)."""

from __future__ import annotations

import dataclasses

import torch

from omniflow.sampling.draw import sample_nucleus, sample_top_k
from tests.factories import sampling_batch as batch


def test_without_ties_it_draws_what_the_nucleus_path_draws_at_top_p_1():
    """Continuous logits (no ties): the one-launch path and the nucleus path (a full sort, the
    top-k candidates, no cut at top_p = 1) agree row for row, with penalties, bans, greedy
    rows and per-row k."""
    g = torch.Generator().manual_seed(0)
    for stream in (0, 3):
        b = batch(64, g)
        logits = 3 * torch.randn(64, 512, generator=g)
        fast = sample_top_k(logits, b, stream)
        assert torch.equal(fast, sample_nucleus(logits, b, stream))
        assert not b.banned.gather(1, fast[:, None]).any()
        # The penalty and the bans act: without them other ids are drawn.
        bare = dataclasses.replace(b, use_penalty=False, banned=None)
        assert not torch.equal(sample_top_k(logits, bare, stream), fast)


def test_ties_at_the_kth_value_stay_candidates_row_by_row():
    """k=2 over [5, 4, 4, 4, 1, ...] draws ids 0..3 (the tied 4s too); k=1 only id 0."""
    g = torch.Generator().manual_seed(1)
    rows = 400
    logits = torch.ones(rows, 64)
    logits[:, 0] = 5.0
    logits[:, 1:4] = 4.0
    top_k = torch.where(torch.arange(rows) % 2 == 0, 2, 1)
    b = batch(
        rows,
        g,
        temperature=torch.full((rows,), 3.0),
        top_k=top_k,
        seeds=torch.arange(rows),
        banned=None,
        seen=None,
        use_top_p=False,
    )
    got = sample_top_k(logits, b, 1)
    assert set(got[0::2].tolist()) == {0, 1, 2, 3}
    assert set(got[1::2].tolist()) == {0}
