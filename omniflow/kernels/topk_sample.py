"""One-launch top-k sampling: the code predictor's 15 draws per frame under a fixed policy
(`topk_sample`), and codebook 0's draw with each request's own settings (`sample_rows`).

The torch form of a draw (temperature, top-k, counter-keyed noise, Gumbel-max) is about fifty
kernels, most of them the integer hash of the noise; a 1.7B frame draws 15 times, so at
batch 1 the draws cost more GPU time than the predictor's matmuls. Codebook 0's draw adds the
repetition penalty and the banned ids: about a hundred torch launches, so at batch 1 the
host's launching, not the GPU, bounds the draw. Here one program per row holds the row in
registers and does all of it.

Semantics: `omniflow.sampling.draw.fixed_policy_torch` (the oracle in the tests, and the
CPU path), after `sample_rows`' optional penalty and bans:
- penalised = logits / penalty where the id was seen and the logit is > 0, logits * penalty
  where seen and <= 0 (Hugging Face's repetition penalty); banned ids -inf;
- scaled = logits / temperature (1 for greedy rows, temperature <= 0), both divisions
  rounded as IEEE division (`tl.div_rn`: torch's);
- the candidates are the ids whose scaled logit is >= the k-th largest (ties at the k-th
  value all stay in, as Hugging Face's top-k warper keeps them); top_k <= 0 or >= V: all;
  k is one for all rows or each row's own;
- the draw is argmax(scaled + Gumbel(u)) over the candidates, u the request's counter-keyed
  uniform for (seed, counter, stream, id) (`omniflow.sampling.draw.uniform_noise_at`, the
  same 32-bit hash computed here in uint32 arithmetic); greedy rows take argmax(scaled);
  ties go to the lowest id.
The k-th largest value is found without sorting: a 32-step bitwise search for the largest
order-preserving key t with at least k keys >= t (the keys are the fp32 bit patterns mapped
to unsigned order).

Graph-safe: shapes, `stream` and a shared `top_k` (Python ints) or per-row k (a device
tensor) fix the launch; no host reads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mix(x):
    """The sampler's 32-bit hash step on uint32 (multiplication wraps mod 2**32)."""
    x = (x ^ (x >> 16)) * 0x45D9F3B
    x = (x ^ (x >> 16)) * 0x45D9F3B
    return x ^ (x >> 16)


@triton.jit(do_not_specialize=["top_k", "stream_key"])
def _topk_sample_kernel(
    logits_ptr,
    seeds_ptr,
    counters_ptr,
    temp_ptr,
    out_ptr,
    stride_row,
    vocab,
    top_k,
    stream_key,
    top_k_ptr,
    seen_ptr,
    stride_seen,
    penalty_ptr,
    banned_ptr,
    stride_banned,
    BLOCK: tl.constexpr,
    ROW_TOP_K: tl.constexpr,
    PENALTY: tl.constexpr,
    BANNED: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < vocab
    x = tl.load(logits_ptr + row * stride_row + cols, mask=valid, other=0.0).to(tl.float32)
    if PENALTY:
        seen = tl.load(seen_ptr + row * stride_seen + cols, mask=valid, other=0) != 0
        p = tl.load(penalty_ptr + row)
        x = tl.where(seen, tl.where(x > 0, tl.div_rn(x, p), x * p), x)
    if BANNED:
        ban = tl.load(banned_ptr + row * stride_banned + cols, mask=valid, other=0) != 0
        x = tl.where(ban, float("-inf"), x)
    temp = tl.load(temp_ptr + row)
    greedy = temp <= 0.0
    scaled = tl.div_rn(x, tl.where(greedy, 1.0, temp))
    scaled = tl.where(valid, scaled, float("-inf"))

    # The k-th largest value: the largest key t with count(key >= t) >= k.
    bits = scaled.to(tl.uint32, bitcast=True)
    negative = (bits >> 31) == 1
    sign = tl.full((), 0x80000000, tl.uint32)
    key = tl.where(negative, ~bits, bits | sign)
    key = tl.where(valid, key, 0)
    # A row's k is clamped to V in int64 before it narrows (a k of 2**32 + 3 means every id).
    row_k = tl.minimum(tl.load(top_k_ptr + row), vocab).to(tl.int32) if ROW_TOP_K else top_k
    k = tl.minimum(tl.where(row_k > 0, row_k, vocab), vocab)
    t = tl.zeros((), dtype=tl.uint32)
    for i in tl.static_range(32):
        trial = t | tl.full((), 1 << (31 - i), tl.uint32)
        enough = tl.sum((key >= trial).to(tl.int32), axis=0) >= k
        t = tl.where(enough, trial, t)
    t_bits = tl.where((t >> 31) == 1, t & ~sign, ~t)
    threshold = t_bits.to(tl.float32, bitcast=True)
    candidate = valid & (scaled >= threshold)

    # Counter-keyed uniforms, bit for bit `uniform_noise_at`.
    seed = tl.load(seeds_ptr + row)
    counter = tl.load(counters_ptr + row)
    lo = seed.to(tl.uint32)
    hi = (seed >> 32).to(tl.uint32)
    base = _mix(lo ^ _mix(hi + 0x9E3779B))
    base = _mix(base ^ _mix(counter.to(tl.uint32) * 0x27D4EB2 + stream_key.to(tl.uint32)))
    h = _mix(base ^ _mix(cols.to(tl.uint32) + 0x5BD1E99))
    # Never 1.0 (+inf noise: NaN on a banned id): the largest float32 below 1, `draw.U_MAX`.
    u = tl.minimum(((h >> 8).to(tl.float32) + 0.5) / 16777216.0, 0.999999940395355224609375)
    gumbel = -tl.log(-tl.log(u))

    score = tl.where(greedy, scaled, scaled + gumbel)
    score = tl.where(candidate, score, float("-inf"))
    choice = tl.argmax(score, axis=0, tie_break_left=True)
    tl.store(out_ptr + row, choice.to(tl.int64))


def stream_key(stream: int) -> int:
    """`stream * 0x165667B1 + 1` mod 2**32: the stream's part of the hash, folded on the host."""
    return (stream * 0x165667B1 + 1) & 0xFFFFFFFF


def topk_sample(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor,
    stream: int,
    top_k: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits [B, V] (any float dtype); seeds, counters [B] int64; temperature [B] float32
    -> ids [B] int64."""
    b, v = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if out is None:
        out = torch.empty(b, device=logits.device, dtype=torch.int64)
    _launch(logits, seeds, counters, temperature, out, stream, top_k)
    return out


def sample_rows(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor,
    stream: int,
    top_k: torch.Tensor,
    seen: torch.Tensor | None = None,
    penalty: torch.Tensor | None = None,
    banned: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each row's own draw: logits [B, V]; seeds, counters, top_k [B] int64 (top_k <= 0 or
    >= V: all ids); temperature [B] float32; seen [B, V] bool with penalty [B] float32 (both
    or neither); banned [B, V] bool -> ids [B] int64. The kernel reads rows with unit
    strides, so other layouts are copied first (a no-op for the runner's own tensors)."""
    b, v = logits.shape
    if (seen is None) != (penalty is None):
        raise ValueError("sample_rows: seen and penalty go together")
    for name, mask in (("seen", seen), ("banned", banned)):
        if mask is not None and mask.shape != (b, v):
            raise ValueError(f"sample_rows: {name} is {tuple(mask.shape)}, expected [{b}, {v}]")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    seeds, counters, temperature, top_k = (
        t.contiguous() for t in (seeds, counters, temperature, top_k)
    )
    seen, penalty, banned = (t if t is None else t.contiguous() for t in (seen, penalty, banned))
    out = torch.empty(b, device=logits.device, dtype=torch.int64)
    _launch(logits, seeds, counters, temperature, out, stream, top_k, seen, penalty, banned)
    return out


def _launch(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor,
    out: torch.Tensor,
    stream: int,
    top_k: int | torch.Tensor,
    seen: torch.Tensor | None = None,
    penalty: torch.Tensor | None = None,
    banned: torch.Tensor | None = None,
) -> None:
    """One program per row. Absent masks and a shared k are compiled out (constexpr
    flags); their pointer arguments are then never read, so `logits` stands in."""
    b, v = logits.shape
    row_k = isinstance(top_k, torch.Tensor)
    _topk_sample_kernel[(b,)](
        logits,
        seeds,
        counters,
        temperature,
        out,
        logits.stride(0),
        v,
        0 if row_k else top_k,
        stream_key(stream),
        top_k if row_k else logits,
        seen if seen is not None else logits,
        seen.stride(0) if seen is not None else 0,
        penalty if penalty is not None else logits,
        banned if banned is not None else logits,
        banned.stride(0) if banned is not None else 0,
        BLOCK=triton.next_power_of_2(v),
        ROW_TOP_K=row_k,
        PENALTY=seen is not None,
        BANNED=banned is not None,
    )
