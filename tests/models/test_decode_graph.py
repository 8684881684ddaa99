"""`TalkerDecodeGraphs`' eager path and `RopeTable` (CPU, tiny model, fp32).

The reference is the runner's decode step as it is today: `Talker.forward` over
`embed_decode`, with `DecodeAttentionMetadata.from_tables(..., batched=True)`. On the CPU the
wrapper runs the same function it captures on CUDA, with the Triton kernel's torch reference
in its place, so equality here means the bucketing, padding and RoPE table change nothing.
Every case starts from KV caches full of random values (a context written by earlier steps).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from torch.nn import functional as F

from omniflow.models.interface import DecodeInputs
from omniflow.models.layers.attention import DecodeAttentionMetadata
from omniflow.models.layers.rope_table import RopeTable
from omniflow.models.layers.rotary import Rotary
from omniflow.models.qwen3_tts.decode_graph import TalkerDecodeGraphs
from omniflow.models.qwen3_tts.inputs import embed_decode
from omniflow.models.qwen3_tts.talker import Talker
from tests.factories import tiny_bundle
from tests.models.test_predictor_graph import HostReads

BS = 4
NUM_BLOCKS = 64
MAX_BLOCKS = 8
DUMMY = NUM_BLOCKS * BS
"""The slot past the pool's blocks: the runner's reserved padding slot."""
TOL = 1e-5

KV = list[tuple[torch.Tensor, torch.Tensor]]


class Case(NamedTuple):
    x: DecodeInputs
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    slot_mapping: torch.Tensor

    @property
    def args(self):
        return self.x, self.block_tables, self.context_lens, self.slot_mapping


def talker() -> Talker:
    return tiny_bundle().talker


def kv_caches(seed: int) -> KV:
    """As `ARModelRunner.__init__` allocates them (plus the dummy slot), filled at random."""
    s = talker().shape
    gen = torch.Generator().manual_seed(seed)
    shape = (NUM_BLOCKS * BS + 1, s.num_kv_heads, s.head_dim)
    return [
        (torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
        for _ in range(s.num_layers)
    ]


def clone(kv: KV) -> KV:
    return [(k.clone(), v.clone()) for k, v in kv]


def decode_case(b: int, seed: int, width: int = MAX_BLOCKS) -> Case:
    """b rows with disjoint random blocks, random lengths (1..width * BS), one new token each
    at the end of its context."""
    t = talker()
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, width * BS + 1, (b,), generator=gen)
    blocks = torch.randperm(NUM_BLOCKS, generator=gen)[: b * width].view(b, width)
    pos = lens - 1
    slots = blocks.gather(1, (pos // BS)[:, None]).squeeze(1) * BS + pos % BS
    x = DecodeInputs(
        tokens=torch.randint(0, 2048, (b,), generator=gen),
        frames=torch.randint(0, 2048, (b, t.num_groups), generator=gen),
        side_ids=torch.randint(0, t.shape.text_vocab_size, (b,), generator=gen),
        positions=pos,
    )
    return Case(x, blocks.to(torch.int32), lens.to(torch.int32), slots)


def reference(case: Case, kv: KV) -> torch.Tensor:
    """The runner's eager decode step today."""
    t = talker()
    meta = DecodeAttentionMetadata.from_tables(
        case.slot_mapping,
        case.block_tables,
        case.context_lens,
        BS,
        tuple(case.context_lens.tolist()),
        batched=True,
    )
    return t.forward(embed_decode(t, case.x), case.x.positions, meta, kv)


def graphs(kv: KV, max_batch: int = 8, buckets=(1, 2, 4, 8), **kw) -> TalkerDecodeGraphs:
    return TalkerDecodeGraphs(
        talker(),
        kv,
        BS,
        max_batch=max_batch,
        max_blocks=MAX_BLOCKS,
        max_positions=MAX_BLOCKS * BS,
        dummy_slot=DUMMY,
        buckets=buckets,
        **kw,
    )


def written(after: KV, before: KV) -> set[int]:
    """Slots whose K or V differs from `before` in any layer."""
    out: set[int] = set()
    for (k, v), (k0, v0) in zip(after, before, strict=True):
        changed = (k != k0).flatten(1).any(1) | (v != v0).flatten(1).any(1)
        out |= set(torch.nonzero(changed).flatten().tolist())
    return out


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < TOL


@pytest.mark.parametrize("b", [1, 3])
def test_run_equals_talker_forward_and_writes_the_same_kv(b):
    start = kv_caches(seed=b)
    case = decode_case(b, seed=10 + b)
    g_kv, ref_kv = clone(start), clone(start)
    g = graphs(g_kv)
    assert not g.graphed  # the CPU runs the bucketed eager path
    got = g.run(*case.args)
    want = reference(case, ref_kv)
    assert_close(got, want)
    real = set(case.slot_mapping.tolist())
    assert written(ref_kv, start) == real
    # The padding rows (b = 3 runs in bucket 4) write only the dummy slot.
    padded = g.bucket_for(b) > b
    assert written(g_kv, start) == (real | {DUMMY} if padded else real)
    for (k, v), (rk, rv) in zip(g_kv, ref_kv, strict=True):
        assert_close(k[:DUMMY], rk[:DUMMY])
        assert_close(v[:DUMMY], rv[:DUMMY])


def test_narrow_block_tables_stale_rows_and_returned_copies():
    """Tables narrower than max_blocks fill the left columns; a larger batch's rows left in
    the buffers are reset to padding; each result is a copy, not a view of the output."""
    start = kv_caches(seed=20)
    g_kv, ref_kv = clone(start), clone(start)
    g = graphs(g_kv, max_batch=4, buckets=(4,))
    first, second = decode_case(4, seed=21), decode_case(3, seed=22, width=4)
    a = g.run(*first.args)
    kept = a.clone()
    b = g.run(*second.args)
    assert torch.equal(a, kept)
    assert_close(a, reference(first, ref_kv))
    assert_close(b, reference(second, ref_kv))
    assert not g.block_tables[:3, 4:].any() and not g.block_tables[3].any()
    assert g.context_lens[3].item() == 0 and g.slot_mapping[3].item() == DUMMY
    assert g.positions[3].item() == 0 and not g.frames[3].any()


def test_batch_above_the_largest_bucket_runs_eager():
    start = kv_caches(seed=30)
    g_kv, ref_kv = clone(start), clone(start)
    g = graphs(g_kv, max_batch=2, buckets=(1, 2))
    case = decode_case(5, seed=31)
    assert g.bucket_for(5) is None
    assert_close(g.run(*case.args), reference(case, ref_kv))
    assert written(g_kv, start) == set(case.slot_mapping.tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_table_equals_rotary_bitwise(dtype):
    """Against a Rotary whose table grew in two steps (another length than the table's)."""
    s = talker().shape
    n = 3000
    table = RopeTable(Rotary(s.head_dim, s.rope_theta), n, torch.device("cpu"), dtype)
    grown = Rotary(s.head_dim, s.rope_theta)
    grown.cos_sin(torch.arange(300), dtype)
    want_cos, want_sin = grown.cos_sin(torch.arange(n), dtype)
    cos, sin = table.lookup(torch.arange(n))
    assert cos.dtype == dtype and torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    positions = torch.randint(0, n, (2, 5), generator=torch.Generator().manual_seed(0))
    cos, sin = table.lookup(positions)
    assert cos.shape == (2, 5, s.head_dim)
    assert torch.equal(cos, want_cos[positions]) and torch.equal(sin, want_sin[positions])


def full_width_attention(q, k_cache, v_cache, context):
    """A torch stand-in for the Triton kernel that, like it, reads no value on the host: each
    row attends over all of its table's slots, masked to its length (length 0: zeros)."""
    tables, lens, block_size = context.block_tables, context.context_lens, context.block_size
    b, hq, d = q.shape
    offsets = torch.arange(block_size, device=q.device)
    slots = (tables.long()[:, :, None] * block_size + offsets).flatten(1)
    mask = torch.arange(slots.shape[1], device=q.device)[None, :] < lens[:, None]
    out = F.scaled_dot_product_attention(
        q[:, :, None, :],
        k_cache[slots].transpose(1, 2),
        v_cache[slots].transpose(1, 2),
        attn_mask=mask[:, None, None, :],
        enable_gqa=True,
    )
    return torch.where(lens[:, None, None] > 0, out[:, :, 0], 0.0)


@pytest.mark.parametrize("b", [3, 8])
def test_the_step_reads_nothing_back_to_the_host(b):
    """The CPU stand-in for a capture: bucket 4 (padded) and the full bucket 8, with the
    kernel replaced by a host-free torch attention. The torch reference the CPU uses reads
    lengths on the host, and the guard sees it (so the guard does watch the attention)."""
    start = kv_caches(seed=40)
    case = decode_case(b, seed=41)
    safe = graphs(clone(start), attention=full_width_attention)
    with HostReads() as mode:
        got = safe.run(*case.args)
    assert mode.seen == []
    assert_close(got, graphs(clone(start)).run(*case.args))
    with HostReads() as mode:
        graphs(clone(start)).run(*case.args)
    assert "torch.Tensor.__int__" in mode.seen


def test_mismatched_inputs_are_refused():
    kv = kv_caches(seed=50)
    case = decode_case(3, seed=51)
    g = graphs(kv)
    with pytest.raises(ValueError, match="slot_mapping"):
        g.run(case.x, case.block_tables, case.context_lens, case.slot_mapping[:2])
    wide = torch.zeros(3, MAX_BLOCKS + 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="columns"):
        g.run(case.x, wide, case.context_lens, case.slot_mapping)
    with pytest.raises(ValueError, match="dummy_slot"):
        TalkerDecodeGraphs(talker(), kv, BS, 8, MAX_BLOCKS, 32, dummy_slot=NUM_BLOCKS * BS + 1)
