"""The Triton paged decode kernel equals its torch reference, and the reference equals the
runner's existing `paged_attention`.

CPU: the kernels run in the Triton interpreter, in a child process (tests/kernels/interpret.py);
each parent test runs one group of checks in one child (about 2 s to start).
The CPU checks use fp32 and fp16: the 3.6 interpreter multiplies bf16 `tl.dot` operands as
raw bits, so bf16 is covered by the CUDA tests only.

CUDA (`-m cuda`): the compiled kernel at the talker's real shapes, and under a CUDA graph.

Positions a kernel must not read (table entries past a row's length, the unused tail of a
row's last block, everything of a zero-length row) point at NaN-filled cache slots, so a
stray read shows up as NaN in the output.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from omniflow.kernels import paged_decode as pd
from omniflow.kernels.args import PagedContext
from omniflow.kernels.paged_decode_ref import paged_decode_attention_ref
from omniflow.models.layers.attention import PagedAttentionMetadata, paged_attention
from tests.kernels.interpret import register, run_checks, run_group_in_child

ROOT = Path(__file__).resolve().parents[2]


def make_case(
    lens: list[int],
    block_size: int,
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    extra_cols: int = 2,
    seed: int = 0,
):
    """Random q and caches, shuffled block ids; unread positions hold NaN (see module doc)."""
    g = torch.Generator().manual_seed(seed)
    g_dev = torch.Generator(device).manual_seed(seed)  # big caches are drawn where they live
    needed = [-(-n // block_size) for n in lens]
    max_blocks = max(needed, default=0) + extra_cols
    num_blocks = sum(needed) + 1  # + one poison block
    perm = torch.randperm(num_blocks, generator=g)
    poison = int(perm[-1])
    shape = (num_blocks * block_size, hkv, d)
    k_cache = torch.randn(shape, generator=g_dev, device=device)
    v_cache = torch.randn(shape, generator=g_dev, device=device)
    k_cache[poison * block_size : (poison + 1) * block_size] = float("nan")
    v_cache[poison * block_size : (poison + 1) * block_size] = float("nan")
    tables = torch.full((len(lens), max_blocks), poison, dtype=torch.int32)
    offset = 0
    for row, (n, nb) in enumerate(zip(lens, needed, strict=True)):
        blocks = perm[offset : offset + nb]
        offset += nb
        tables[row, :nb] = blocks.int()
        if nb and n % block_size:  # the unused tail of the last block
            first = int(blocks[-1]) * block_size + n % block_size
            k_cache[first : (int(blocks[-1]) + 1) * block_size] = float("nan")
            v_cache[first : (int(blocks[-1]) + 1) * block_size] = float("nan")
    q = torch.randn(len(lens), hq, d, generator=g)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    return [t.to(device) for t in (q.to(dtype), k_cache.to(dtype), v_cache.to(dtype))] + [
        tables.to(device),
        lens_t.to(device),
    ]


LENS = {  # tiles are 64 tokens at these block sizes
    1: lambda bs: [130],  # three tiles, the last block partial
    3: lambda bs: [1, 2 * bs, 0],  # length 1, exactly full blocks, a padded row
    5: lambda bs: [bs - 1, 0, 128, 1, 3 * bs + 1],  # 128: two whole tiles
}


def test_reference_matches_existing_paged_attention():
    for lens, bs, hq, hkv in (([1, 8, 0, 17, 33], 4, 4, 2), ([50, 16, 3], 16, 4, 4)):
        q, kc, vc, tables, ctx = make_case(lens, bs, hq, hkv, 16)
        ref = paged_decode_attention_ref(q, kc, vc, PagedContext(tables, ctx, bs))
        live = [i for i, n in enumerate(lens) if n > 0]
        slots = []
        for i in live:
            blocks = tables[i].long()
            slots.append((blocks[:, None] * bs + torch.arange(bs)).flatten()[: lens[i]])
        meta = PagedAttentionMetadata(
            slot_mapping=torch.stack([s[-1] for s in slots]),
            query_starts=tuple(range(len(live) + 1)),
            seq_lens=tuple(lens[i] for i in live),
            context_slots=tuple(slots),
        )
        existing = paged_attention(q[live], kc, vc, meta)
        torch.testing.assert_close(ref[live], existing, atol=1e-5, rtol=0)
        assert not ref.isnan().any()
        assert (ref[[i for i, n in enumerate(lens) if n == 0]] == 0).all()


# --- CPU: kernels in the Triton interpreter (child process) ----------------------------------


def check_against_reference(batch: int, block_size: int, group: int, parts: int) -> None:
    hkv, d = 2, 16
    lens = LENS[batch](block_size)
    # Tables wide enough for 3+ tiles (as a CUDA-graph bucket's are): with parts=3 every
    # case takes split-K, and short rows leave whole partitions empty.
    extra = max(2, 3 * pd._block_n(block_size) // block_size)
    case = make_case(lens, block_size, group * hkv, hkv, d, extra_cols=extra, seed=batch)
    q, kc, vc, tables, ctx = case
    assert (pd._plan(tables.shape[1], block_size, parts)[1] > 1) == (parts > 1)
    context = PagedContext(tables, ctx, block_size)
    ref = paged_decode_attention_ref(q, kc, vc, context)
    got = pd.paged_decode_attention(q, kc, vc, context, num_partitions=parts)
    assert got.dtype == q.dtype and got.shape == q.shape
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got[ctx == 0] == 0).all()


def check_public_entry() -> None:
    """Takes split-K at this small batch; honours scale and a preallocated out."""
    lens, bs = [70, 0, 5], 4
    q, kc, vc, tables, ctx = make_case(lens, bs, 4, 2, 16, extra_cols=20)
    assert pd._num_partitions(3, 2, tables.shape[1], bs) > 1
    out = torch.full_like(q, 7.0)
    context = PagedContext(tables, ctx, bs)
    got = pd.paged_decode_attention(q, kc, vc, context, scale=0.3, out=out)
    assert got is out
    ref = paged_decode_attention_ref(q, kc, vc, context, scale=0.3)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def check_half_precision(parts: int) -> None:
    lens, bs = [37, 1, 0], 4
    q, kc, vc, tables, ctx = make_case(lens, bs, 4, 2, 16, dtype=torch.float16)
    context = PagedContext(tables, ctx, bs)
    ref = paged_decode_attention_ref(q, kc, vc, context)
    got = pd.paged_decode_attention(q, kc, vc, context, num_partitions=parts)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, ref, atol=2e-3, rtol=0)


def _grid(parts: int) -> list[tuple[str, Callable[[], None]]]:
    """Every batch and block size, each seen with GQA ratio 1 and 2 (not the full product:
    the interpreter costs ~50 ms per program)."""
    cases = [(1, 4, 1), (1, 16, 2), (3, 4, 2), (3, 16, 1), (5, 4, 1), (5, 16, 2)]
    return [
        (
            f"batch={b} block_size={bs} group={g} parts={parts}",
            lambda b=b, bs=bs, g=g: check_against_reference(b, bs, g, parts),
        )
        for b, bs, g in cases
    ]


GROUPS: dict[str, Callable[[], list[tuple[str, Callable[[], None]]]]] = {
    "plain": lambda: [*_grid(1), ("fp16", lambda: check_half_precision(1))],
    "split_k": lambda: [
        *_grid(3),
        ("fp16", lambda: check_half_precision(2)),
        ("public entry", check_public_entry),
    ],
}


register(__name__, sorted(GROUPS))


def run_interpreted(group: str) -> int:
    """Child entry point (see tests/kernels/interpret.py)."""
    kernels = (pd._paged_decode_kernel, pd._combine_kernel)
    return run_checks(group, kernels, GROUPS[group]())


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_kernel_matches_reference_in_triton_interpreter(group):
    run_group_in_child("tests.kernels.test_paged_decode", group)


def test_partition_rule_depends_on_shapes_only():
    assert pd._num_partitions(128, 8, 256, 16) == 1
    assert pd._num_partitions(8, 8, 256, 16) == 1  # 64 programs already
    assert pd._num_partitions(1, 8, 256, 16) == 32  # 4096 tokens / 64 = 64 tiles, 256 / 8
    assert pd._num_partitions(1, 1, 256, 16) == pd.MAX_PARTITIONS
    assert pd._num_partitions(2, 8, 1, 16) == 1  # one tile: nothing to split


# --- GPU: real shapes, bf16, CUDA graphs ---------------------------------------------------

HQ, HKV, D, BS = 16, 8, 128, 16


def cuda_lens(batch: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 4097, (batch,), generator=g).tolist()
    lens[0] = 4096
    if batch > 1:
        lens[1] = 1
    if batch > 2:
        lens[2] = 0
    if batch > 3:
        lens[3] = 5 * BS
    return lens


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 2, 7, 32, 128])
def test_cuda_bf16_real_shapes(batch):
    lens = cuda_lens(batch, batch)
    case = make_case(lens, BS, HQ, HKV, D, torch.bfloat16, "cuda", seed=batch)
    q, kc, vc, tables, ctx = case
    context = PagedContext(tables, ctx, BS)
    ref = paged_decode_attention_ref(q, kc, vc, context)
    got = pd.paged_decode_attention(q, kc, vc, context)  # compiles
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    torch.cuda.set_sync_debug_mode("error")  # once compiled, a launch must not sync
    try:
        again = pd.paged_decode_attention(q, kc, vc, context)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(again, got, atol=0, rtol=0)
    parts = pd._num_partitions(batch, HKV, tables.shape[1], BS)
    other = pd.paged_decode_attention(q, kc, vc, context, num_partitions=1 if parts > 1 else 8)
    torch.testing.assert_close(other, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [2, 16])  # split-K and plain
def test_cuda_graph_replays_with_new_values(batch):
    max_blocks = 4096 // BS
    num_slots = (batch * max_blocks + 1) * BS
    dev, bf16 = "cuda", torch.bfloat16
    q = torch.randn(batch, HQ, D, device=dev, dtype=bf16)
    kc = torch.randn(num_slots, HKV, D, device=dev, dtype=bf16)
    vc = torch.randn_like(kc)
    tables = torch.zeros(batch, max_blocks, dtype=torch.int32, device=dev)
    ctx = torch.zeros(batch, dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    context = PagedContext(tables, ctx, BS)

    def fill(seed: int) -> None:
        lens = cuda_lens(batch, seed)
        case = make_case(lens, BS, HQ, HKV, D, bf16, dev, extra_cols=0, seed=seed)
        new_q, new_k, new_v, new_tables, new_ctx = case
        q.copy_(new_q)
        kc.zero_()
        kc[: new_k.shape[0]].copy_(new_k)
        vc.zero_()
        vc[: new_v.shape[0]].copy_(new_v)
        tables.copy_(new_tables)
        for row, n in enumerate(lens):  # garbage past each row's length: a read would fault
            tables[row, -(-n // BS) :] = 2**30
        ctx.copy_(new_ctx)

    fill(1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (compile) outside the capture
        pd.paged_decode_attention(q, kc, vc, context, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pd.paged_decode_attention(q, kc, vc, context, out=out)

    for seed in (2, 3):
        fill(seed)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_decode_attention_ref(q, kc, vc, context)
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
