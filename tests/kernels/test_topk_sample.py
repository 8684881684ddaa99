"""The fixed-policy sampler: its torch semantics (ties kept, greedy, counter-keyed noise) and
the one-launch Triton kernel against it (CPU: Triton interpreter; GPU: real shapes)."""

from __future__ import annotations

import pytest
import torch

from omniflow.kernels import topk_sample as ts
from omniflow.sampling.draw import (
    U_MAX,
    SamplingBatch,
    draw_fixed_policy,
    fixed_policy_torch,
    sample_top_k,
    uniform_noise_at,
)
from tests.kernels.interpret import register, run_checks, run_group_in_child


def keys(b: int, seed: int, device: str = "cpu"):
    """Seeds across the whole int64 range (negative, above 2**32), counters, temperatures
    with greedy rows mixed in."""
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-(2**62), 2**62, (b,), generator=g)
    seeds[0] = 7
    counters = torch.randint(0, 2**34, (b,), generator=g)
    temperature = torch.tensor([0.0 if i % 4 == 2 else 0.6 + 0.1 * (i % 5) for i in range(b)])
    return [t.to(device) for t in (seeds, counters, temperature)]


def test_ties_at_the_kth_value_all_stay_candidates():
    """k=2 over [5, 4, 4, 4, 1, ...]: ids 0..3 are drawn (the three tied 4s included), no
    other id ever is."""
    v, rows = 64, 400
    logits = torch.full((rows, v), 1.0)
    logits[:, 0] = 5.0
    logits[:, 1:4] = 4.0
    seeds = torch.arange(rows)
    counters = torch.zeros(rows, dtype=torch.int64)
    temp = torch.full((rows,), 2.0)
    got = fixed_policy_torch(logits, 1, seeds, counters, temp, top_k=2)
    assert set(got.tolist()) == {0, 1, 2, 3}


def test_greedy_rows_take_the_first_maximum_and_top_k_zero_means_all():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [9.0, 0.0, 0.0, 0.0]])
    seeds, counters = torch.tensor([1, 2]), torch.tensor([0, 0])
    greedy = torch.zeros(2)
    assert fixed_policy_torch(logits, 3, seeds, counters, greedy, top_k=1).tolist() == [1, 0]
    # top_k 0 and top_k >= V: every id is a candidate, so with a flat row all ids appear.
    flat = torch.zeros(300, 4)
    many = torch.arange(300)
    for k in (0, 4, 10):
        drawn = fixed_policy_torch(flat, 1, many, many * 0, torch.ones(300), top_k=k)
        assert set(drawn.tolist()) == {0, 1, 2, 3}, k


def test_draw_is_the_gumbel_argmax_of_the_counter_keyed_noise():
    """The draw is fixed by (seed, counter, stream): recomputed from `uniform_noise_at` by
    hand, and different streams give different draws."""
    b, v = 8, 2048
    seeds, counters, temp = keys(b, 1)
    logits = torch.randn(b, v, generator=torch.Generator().manual_seed(3))
    got = fixed_policy_torch(logits, 5, seeds, counters, temp, top_k=50)
    ids = torch.arange(v).expand(b, -1)
    gumbel = -torch.log(-torch.log(uniform_noise_at(seeds, counters, 5, ids)))
    scaled = logits / torch.where(temp > 0, temp, torch.ones_like(temp))[:, None]
    kth = scaled.topk(50).values[:, -1:]
    score = torch.where(temp[:, None] > 0, scaled + gumbel, scaled)
    want = score.masked_fill(scaled < kth, float("-inf")).argmax(-1)
    assert torch.equal(got, want)
    other = fixed_policy_torch(logits, 6, seeds, counters, temp, top_k=50)
    assert not torch.equal(got[temp > 0], other[temp > 0])


TOP_HASH = (31, 366, 0, 2266)
"""(seed, counter, stream, id) whose hash is the largest: its uniform rounded to 1.0 in
float32 (found by search; seed 31 drew the suppressed id 2266 there and the stage died)."""


def top_hash_row(v: int = 3072, banned_id: bool = True) -> tuple[torch.Tensor, SamplingBatch]:
    """One row at `TOP_HASH` with flat logits, the id banned (or not), top-k 50 of all."""
    seed, counter, _, tid = TOP_HASH
    banned = torch.zeros(1, v, dtype=torch.bool)
    banned[0, tid] = banned_id
    batch = SamplingBatch(
        temperature=torch.tensor([0.9]),
        top_k=torch.tensor([0]),
        top_p=torch.ones(1),
        repetition_penalty=torch.ones(1),
        seeds=torch.tensor([seed]),
        counters=torch.tensor([counter]),
        banned=banned,
        use_top_p=False,
        use_penalty=False,
        seen=torch.zeros(1, v, dtype=torch.bool),
    )
    return torch.zeros(1, v), batch


def test_the_top_hash_gives_a_uniform_below_one_and_a_banned_id_is_never_drawn():
    """The one hash value whose uniform float32 rounds to 1.0 is clamped to the largest
    float32 below 1: finite noise, so a banned id stays -inf (it was +inf - inf = NaN, which
    argmax took). Other uniforms are unchanged."""
    seed, counter, stream, tid = TOP_HASH
    ids = torch.arange(3072)[None, :]
    u = uniform_noise_at(torch.tensor([seed]), torch.tensor([counter]), stream, ids)[0]
    assert u[tid].item() == U_MAX < 1.0 and (u < 1).all() and (u > 0).all()
    assert (u[:tid] < U_MAX).all() and (u[tid + 1 :] < U_MAX).all()  # only that one clamped
    logits, batch = top_hash_row()
    got = sample_top_k(logits, batch, stream).item()
    assert got != tid and 0 <= got < 3072
    logits, free = top_hash_row(banned_id=False)
    assert sample_top_k(logits, free, stream).item() == tid  # the largest noise wins a tie
    logits[0, tid] = -20.0  # finite noise (~16.6): a logit far below the others still loses
    assert sample_top_k(logits, free, stream).item() != tid


def test_the_kernel_clamps_at_the_bound_of_the_torch_draw():
    """The kernel's literal bound is `draw.U_MAX` in float32 (a different one would make the
    two draws disagree at the top hash value)."""
    import inspect
    import re

    src = inspect.getsource(ts._topk_sample_kernel.fn)
    bounds = re.findall(r"16777216\.0,\s*([0-9.]+)\)", src)
    assert len(bounds) == 1
    assert float(torch.tensor(float(bounds[0]), dtype=torch.float32)) == U_MAX


def check_top_hash() -> None:
    """The kernel clamps the same uniform: equal to torch, the banned id never drawn."""
    _, _, stream, tid = TOP_HASH
    for banned_id, low, drawn in ((True, False, False), (False, False, True), (False, True, False)):
        logits, b = top_hash_row(banned_id=banned_id)
        if low:  # +inf noise would still draw it; the clamped noise loses to the others
            logits[0, tid] = -20.0
        want = sample_top_k(logits, b, stream)
        got = ts.sample_rows(
            logits, b.seeds, b.counters, b.temperature, stream, b.top_k, None, None, b.banned
        )
        assert torch.equal(got, want) and (got.item() == tid) == drawn


# --- the kernel against the torch semantics --------------------------------------------


def check_kernel(
    b: int, v: int, top_k: int, stream: int, dtype: torch.dtype, tied: bool, seed: int
) -> None:
    seeds, counters, temp = keys(b, seed)
    g = torch.Generator().manual_seed(seed + 100)
    if tied:  # few distinct values: heavy ties at the k-th value
        logits = torch.randint(-4, 4, (b, v), generator=g).float() / 2
    else:
        logits = 3 * torch.randn(b, v, generator=g)
    logits = logits.to(dtype)
    got = ts.topk_sample(logits, seeds, counters, temp, stream, top_k)
    want = fixed_policy_torch(logits, stream, seeds, counters, temp, top_k)
    assert got.dtype == torch.int64
    assert torch.equal(got, want), (got.tolist(), want.tolist())


def check_rows(b: int, v: int, stream: int, tied: bool, seed: int) -> None:
    """`sample_rows` (per-row k, penalty, bans) against `sample_top_k`'s torch path."""
    seeds, counters, temp = keys(b, seed)
    g = torch.Generator().manual_seed(seed + 200)
    if tied:
        logits = torch.randint(-4, 4, (b, v), generator=g).float() / 2
    else:
        logits = 3 * torch.randn(b, v, generator=g)
    top_k = torch.randint(-1, 60, (b,), generator=g)  # <= 0 rows: every id
    top_k[0] = 2**32 + 3  # >= V: every id (not 3 after narrowing to 32 bits)
    temp[0] = 100.0  # nearly uniform: a draw among all ids, rarely among the top 3
    seen = torch.rand(b, v, generator=g) < 0.3
    banned = torch.rand(b, v, generator=g) < 0.1
    penalty = 1.0 + torch.rand(b, generator=g)
    batch = SamplingBatch(
        temperature=temp,
        top_k=top_k,
        top_p=torch.ones(b),
        repetition_penalty=penalty,
        seeds=seeds,
        counters=counters,
        banned=banned,
        use_top_p=False,
        seen=seen,
    )
    want = sample_top_k(logits, batch, stream)
    got = ts.sample_rows(logits, seeds, counters, temp, stream, top_k, seen, penalty, banned)
    assert torch.equal(got, want), (got.tolist(), want.tolist())
    assert not banned.gather(1, got[:, None]).any()
    plain = ts.sample_rows(logits, seeds, counters, temp, stream, top_k)
    assert not torch.equal(plain, got)  # the penalty and bans acted


GROUPS = {
    "rows": lambda: [
        ("penalty, bans, per-row k", lambda: check_rows(8, 512, 2, False, 11)),
        ("ties", lambda: check_rows(8, 300, 4, True, 12)),
        ("the top hash value", check_top_hash),
    ],
    "sample": lambda: [
        ("k=50 fp32", lambda: check_kernel(6, 2048, 50, 1, torch.float32, False, 1)),
        ("k=50 stream 15 fp16", lambda: check_kernel(5, 2048, 50, 15, torch.float16, False, 2)),
        ("ties", lambda: check_kernel(6, 2048, 50, 3, torch.float32, True, 3)),
        ("V not a power of two", lambda: check_kernel(4, 3000, 7, 2, torch.float32, True, 4)),
        ("k=0: all", lambda: check_kernel(3, 100, 0, 1, torch.float32, False, 5)),
        ("k>V: all", lambda: check_kernel(3, 100, 500, 1, torch.float32, True, 6)),
        ("k=1", lambda: check_kernel(3, 256, 1, 9, torch.float32, True, 7)),
    ],
}


register(__name__, sorted(GROUPS))


def run_interpreted(group: str) -> int:
    """Child entry point (see tests/kernels/interpret.py)."""
    return run_checks(group, (ts._topk_sample_kernel,), GROUPS[group]())


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_kernel_matches_torch_in_triton_interpreter(group):
    run_group_in_child("tests.kernels.test_topk_sample", group)


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 32, 256])
def test_cuda_kernel_matches_torch_and_replays_in_a_graph(batch):
    """Equal to the torch draw (a mismatch may only be a near tie of two scores, from the
    last bit of a logarithm), and a captured launch replays with new keys."""
    dev = "cuda"
    seeds, counters, temp = keys(batch, batch, dev)
    logits = (3 * torch.randn(batch, 2048, device=dev)).to(torch.bfloat16)
    got = draw_fixed_policy(logits, 4, seeds, counters, temp, top_k=50)
    want = fixed_policy_torch(logits, 4, seeds, counters, temp, 50)
    assert (got == want).float().mean() >= 0.99
    out = torch.empty(batch, dtype=torch.int64, device=dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ts.topk_sample(logits, seeds, counters, temp, 4, 50, out=out)
    counters += 1
    graph.replay()
    again = ts.topk_sample(logits, seeds, counters, temp, 4, 50)
    assert torch.equal(out, again)
