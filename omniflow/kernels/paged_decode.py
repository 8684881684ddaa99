"""Paged decode attention in Triton: one new query token per request over its paged KV.

Layout (as in `omniflow.models.layers.attention`): per layer `k_cache, v_cache` of shape
[num_slots, Hkv, D], slot = block_id * block_size + offset; a request's context is its block
table row. This step's K/V are already in the cache, so the query attends to positions
0..context_len-1 with no further mask. `paged_decode_ref.paged_decode_attention_ref` is the
oracle.

Why it is shaped this way:
- CUDA-graph safe: the launcher never reads block tables or lengths on the host; the grid and
  every constexpr come from tensor shapes and block_size only, so a captured graph replays
  correctly after new values are copied into the same buffers. Lengths are read in-kernel.
- One program per (row, kv head, partition) computes all Hq // Hkv query heads of its GQA
  group, so each K/V tile is loaded once for the group. The group is padded to 16 rows so
  both products run on `tl.dot` (tensor cores); decode is bandwidth-bound, the padding is
  free compute.
- The context is walked in tiles of BLOCK_N tokens (whole blocks when block_size is a power
  of two); each token's slot comes from its block table entry. Loads of positions >= the
  length are masked, so table entries past a row's length and a zero-length row's entries
  are never dereferenced. Online softmax in fp32 (base 2, scale folded in).
- Split-K (flash decoding): with few (row, kv head) programs the GPU would idle, so the
  context is also cut into a fixed number of partitions (chosen from B, Hkv and max_blocks,
  all shapes) on a third grid axis. Each writes its partial (max, sum, unnormalised acc)
  and a small kernel combines them. Partitions past a row's length write an empty state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omniflow.kernels.args import PagedContext

BLOCK_N_MIN = 64
"""Tokens per tile (at least one block)."""
SPLIT_BELOW_PROGRAMS = 64
"""Use split-K when B * Hkv is below this: fewer programs than about half a large GPU's SMs
leave most of it idle."""
TARGET_PROGRAMS = 256
"""Split-K aims for about this many programs (about two waves on a large GPU)."""
MAX_PARTITIONS = 64
"""Caps the combine kernel's [partitions, D] fp32 tile."""
_LOG2E = 1.4426950408889634


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    lens_ptr,
    out_ptr,
    m_ptr,
    l_ptr,
    scale_log2e,
    max_blocks,
    tiles_per_part,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_btb,
    stride_ob,
    stride_oh,
    stride_op,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_PARTS: tl.constexpr,
    SPLIT: tl.constexpr,
):
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kvh * GROUP + g

    q = tl.load(
        q_ptr + row * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    # Clamp so a bad length can never walk past the row's block table.
    ctx = tl.load(lens_ptr + row).to(tl.int32)
    ctx = tl.maximum(tl.minimum(ctx, max_blocks * BLOCK_SIZE), 0)
    tile_lo = part * tiles_per_part
    tile_hi = tl.minimum(tile_lo + tiles_per_part, tl.cdiv(ctx, BLOCK_N))

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = bt_ptr + row.to(tl.int64) * stride_btb
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_vh
    for tile in range(tile_lo, tile_hi):
        pos = tile * BLOCK_N + n
        valid = pos < ctx
        block = tl.load(bt_row + pos // BLOCK_SIZE, mask=valid, other=0)
        slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_ok = valid[:, None] & d_ok[None, :]
        k = tl.load(k_head + slot[:, None] * stride_ks + d[None, :], mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2e  # [G, N], base 2
        s = tl.where(valid[None, :], s, float("-inf"))
        # Every visited tile has a valid token, so m_new is finite and alpha well defined.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + slot[:, None] * stride_vs + d[None, :], mask=kv_ok, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new

    out_mask = g_ok[:, None] & d_ok[None, :]
    out_offs = row * stride_ob + heads[:, None] * stride_oh + part * stride_op + d[None, :]
    if SPLIT:
        # Partial state [B, Hq, P] / [B, Hq, P, D]; an empty partition leaves (-inf, 0, 0).
        ml_offs = (row * (GROUP * tl.num_programs(1)) + heads) * NUM_PARTS + part
        tl.store(m_ptr + ml_offs, m_i, mask=g_ok)
        tl.store(l_ptr + ml_offs, l_i, mask=g_ok)
        tl.store(out_ptr + out_offs, acc, mask=out_mask)
    else:
        # A zero-length row has acc == 0 and l == 0: it writes zeros.
        result = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + out_offs, result.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _combine_kernel(
    acc_ptr,
    m_ptr,
    l_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    NUM_PARTS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    p = tl.arange(0, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    p_ok = p < NUM_PARTS
    base = (row * tl.num_programs(1) + head) * NUM_PARTS
    m = tl.load(m_ptr + base + p, mask=p_ok, other=float("-inf"))
    l_part = tl.load(l_ptr + base + p, mask=p_ok, other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # all empty: weights become 0
    w = tl.exp2(m - m_max)
    denom = tl.sum(w * l_part, 0)
    acc = tl.load(
        acc_ptr + (base + p)[:, None] * HEAD_DIM + d[None, :],
        mask=p_ok[:, None] & (d[None, :] < HEAD_DIM),
        other=0.0,
    )
    result = tl.sum(acc * w[:, None], 0) / tl.where(denom > 0, denom, 1.0)
    tl.store(
        out_ptr + row * stride_ob + head * stride_oh + d,
        result.to(out_ptr.dtype.element_ty),
        mask=d < HEAD_DIM,
    )


def _block_n(block_size: int) -> int:
    return max(BLOCK_N_MIN, triton.next_power_of_2(block_size))


def _num_tiles(max_blocks: int, block_size: int) -> int:
    """Tiles of BLOCK_N tokens covering a full block-table row (what partitions divide)."""
    return triton.cdiv(max_blocks * block_size, _block_n(block_size))


def _num_partitions(batch: int, num_kv_heads: int, max_blocks: int, block_size: int) -> int:
    """Split-K partitions from shapes only: 1 when B * Hkv programs already fill the GPU,
    else enough to reach about TARGET_PROGRAMS (at least a tile each, at most MAX_PARTITIONS)."""
    programs = batch * num_kv_heads
    if programs == 0 or programs >= SPLIT_BELOW_PROGRAMS:
        return 1
    num_tiles = _num_tiles(max_blocks, block_size)
    return max(1, min(num_tiles, triton.cdiv(TARGET_PROGRAMS, programs), MAX_PARTITIONS))


def _plan(max_blocks: int, block_size: int, num_partitions: int) -> tuple[int, int]:
    """(tiles per partition, partitions) covering max_blocks, no partition always empty."""
    num_tiles = _num_tiles(max_blocks, block_size)
    tiles_per_part = max(1, triton.cdiv(num_tiles, max(1, num_partitions)))
    return tiles_per_part, max(1, triton.cdiv(num_tiles, tiles_per_part))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    context: PagedContext,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    num_partitions: int | None = None,
) -> torch.Tensor:
    """q: [B, Hq, D] -> [B, Hq, D] in q's dtype. k_cache/v_cache: [slots, Hkv, D]; `context`:
    block_tables [B, max_blocks] int32, context_lens [B] int32 (0: padding row, writes 0).
    scale defaults to D ** -0.5 (what SDPA, and so the model, uses). Graph-safe.
    `num_partitions`: split-K's partition count, by default from the shapes
    (`_num_partitions`); the tests force both paths with it."""
    block_tables, context_lens = context.block_tables, context.context_lens
    block_size = context.block_size
    if num_partitions is None:
        num_partitions = _num_partitions(
            q.shape[0], k_cache.shape[1], block_tables.shape[1], block_size
        )
    batch, hq, d = q.shape
    hkv = k_cache.shape[1]
    max_blocks = block_tables.shape[1]
    assert k_cache.shape[1:] == (hkv, d) and v_cache.shape == k_cache.shape, "cache shape"
    assert hq % hkv == 0, "num_heads must be a multiple of num_kv_heads"
    assert q.dtype == k_cache.dtype == v_cache.dtype, "q and caches must share a dtype"
    assert block_tables.shape[0] == batch and context_lens.shape == (batch,)
    assert q.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    assert block_tables.stride(1) == 1 and context_lens.is_contiguous()
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride(2) == 1
    if batch == 0:
        return out
    scale = d**-0.5 if scale is None else scale
    group = hq // hkv
    block_n = _block_n(block_size)
    tiles_per_part, parts = _plan(max_blocks, block_size, num_partitions)
    split = parts > 1
    if split:
        acc = torch.empty(batch, hq, parts, d, dtype=torch.float32, device=q.device)
        m = torch.empty(batch, hq, parts, dtype=torch.float32, device=q.device)
        lsum = torch.empty_like(m)
        dst, strides = acc, (acc.stride(0), acc.stride(1), acc.stride(2))
    else:
        m = lsum = out  # unused
        dst, strides = out, (out.stride(0), out.stride(1), 0)
    block_d = triton.next_power_of_2(d)
    _paged_decode_kernel[(batch, hkv, parts)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        dst,
        m,
        lsum,
        scale * _LOG2E,
        max_blocks,
        tiles_per_part,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        block_tables.stride(0),
        *strides,
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=d,
        BLOCK_D=block_d,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        NUM_PARTS=parts,
        SPLIT=split,
        num_warps=4,
    )
    if split:
        _combine_kernel[(batch, hq)](
            acc,
            m,
            lsum,
            out,
            out.stride(0),
            out.stride(1),
            NUM_PARTS=parts,
            BLOCK_P=triton.next_power_of_2(parts),
            HEAD_DIM=d,
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out
