"""Paged decode attention on CUDA: the Triton kernel vs the torch batched path (gather + SDPA).

    python -m benchmarks.attention_bench --batch 1 8 32 128 --context 128 512 2048

1.7B talker shapes (16 query heads, 8 KV heads, head dim 128, block 16, bf16); random
contexts of the given length in shuffled blocks. Median microseconds per call (CUDA events
via triton.testing.do_bench), one JSON line per case.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton.testing

from omniflow.kernels.args import PagedContext
from omniflow.kernels.paged_decode import paged_decode_attention
from omniflow.models.layers.attention import DecodeAttentionMetadata

HQ, HKV, D, BS = 16, 8, 128, 16


def case(batch: int, context: int) -> dict[str, float | int]:
    dev = torch.device("cuda")
    blocks_per_row = -(-context // BS)
    num_blocks = batch * blocks_per_row + 1
    k = torch.randn(num_blocks * BS, HKV, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(batch, HQ, D, device=dev, dtype=torch.bfloat16)
    perm = torch.randperm(num_blocks - 1, device=dev)[: batch * blocks_per_row] + 1
    tables = perm.view(batch, blocks_per_row).to(torch.int32)
    lens = torch.full((batch,), context, device=dev, dtype=torch.int32)
    meta = DecodeAttentionMetadata.from_tables(
        torch.zeros(batch, dtype=torch.int64, device=dev),
        tables,
        lens,
        BS,
        (context,) * batch,
        batched=True,
    )
    ours = paged_decode_attention(q, k, v, PagedContext(tables, lens, BS))
    ref = meta.attend(q, k, v)
    err = ((ours.float() - ref.float()).norm() / ref.float().norm()).item()
    t_triton = triton.testing.do_bench(
        lambda: paged_decode_attention(q, k, v, PagedContext(tables, lens, BS)),
        return_mode="median",
    )
    t_torch = triton.testing.do_bench(lambda: meta.attend(q, k, v), return_mode="median")
    return {
        "batch": batch,
        "context": context,
        "triton_us": t_triton * 1e3,
        "torch_us": t_torch * 1e3,
        "rel_err": err,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--context", type=int, nargs="+", default=[128, 512, 2048])
    args = ap.parse_args()
    for b in args.batch:
        for c in args.context:
            print(json.dumps(case(b, c)), flush=True)


if __name__ == "__main__":
    main()
