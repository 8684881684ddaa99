"""Does programmatic dependent launch shorten a chain of one-row GEMVs? On CUDA (Hopper).

    OMNIFLOW_COMMIT=$(git rev-parse --short HEAD) python -m omniflow.bench.pdl_chain --out r.json

Why: a batch-1 frame of the 1.7B code predictor is ~630 small kernels back to back inside a
CUDA graph, and its phase takes about twice its kernels' summed time (docs/benchmarks.md):
each kernel waits for the previous one to finish before it starts, and then waits again for
its first weight tile to arrive from memory. With programmatic dependent launch
(`skinny_linear(..., pdl=True)`) the next GEMV's programs start while the previous kernel
runs and load their first weight tile (weights are never written while a graph runs), then
wait for the previous kernel's output.

The chain is the code predictor's layer, `--layers` times with distinct weights (31 MB a
layer: 75 layers are one frame's 2.3 GB, far past the 50 MB L2): q/k/v (4096 x 1024), o
(1024 x 2048, reading the first 2048 outputs), gate/up (6144 x 1024), the gated down
projection (1024 x 3072, split-K: two launches), each reading the previous output, with
the kernel's tuned tiles. It is captured once as a CUDA graph with plain launches and once
with `pdl`, the two final outputs must be equal bit for bit, and each graph is replayed
`--reps` times; the median microseconds per GEMV of each are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from omniflow.bench.gemv_bench import provenance, replay_median_us
from omniflow.kernels.skinny_gemm import TUNED_ONE_ROW, skinny_linear

LAYER = (("qkv", 4096, 1024), ("o", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072))
"""The code predictor's one-row projections (name, N, K) in the order a layer runs them."""

Chain = list[tuple[str, torch.Tensor]]


def chain_weights(layers: int, copies: int = 1, device: str = "cuda") -> Chain:
    """`layers` x LAYER bf16 weights, each scaled so activations keep unit size; `copies`
    repeats the whole list (distinct tensors) for a longer chain."""
    weights = []
    for _ in range(layers * copies):
        for name, n, k in LAYER:
            w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
            weights.append((name, w))
    return weights


def run_chain(x: torch.Tensor, weights: Chain, pdl: bool) -> torch.Tensor:
    """The chain from a [1, 1024] row: each GEMV reads the previous one's output."""
    h = x
    for name, w in weights:
        config = TUNED_ONE_ROW[(w.shape[0], w.shape[1])]
        if name == "down":
            gate, up = h.chunk(2, dim=-1)
            h = skinny_linear(gate, w, config, up=up, pdl=pdl)
        else:
            h = skinny_linear(h[:, : w.shape[1]], w, config, pdl=pdl)
    return h


def time_chain(x: torch.Tensor, weights: Chain, pdl: bool, reps: int) -> tuple[float, torch.Tensor]:
    """Median us per GEMV of the captured chain, and its output."""
    run_chain(x, weights, pdl)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run_chain(x, weights, pdl)
    return replay_median_us(graph, reps, len(weights)), out.clone()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", type=int, default=75, help="code-predictor layers in the chain")
    ap.add_argument("--reps", type=int, default=20, help="timed replays of each graph")
    ap.add_argument("--out", default="pdl_chain.json", help="JSON file for the numbers")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("pdl_chain needs a CUDA GPU")
    torch.manual_seed(0)
    weights = chain_weights(args.layers)
    x = torch.randn(1, LAYER[0][2], device="cuda", dtype=torch.bfloat16)
    plain_us, plain = time_chain(x, weights, False, args.reps)
    pdl_us, with_pdl = time_chain(x, weights, True, args.reps)
    equal = bool(torch.equal(plain, with_pdl))
    report = {
        **provenance(),
        "layers": args.layers,
        "gemvs": len(weights),
        "reps": args.reps,
        "us_per_gemv": {"plain": plain_us, "pdl": pdl_us},
        "frame_ms": {"plain": plain_us * len(weights) / 1e3, "pdl": pdl_us * len(weights) / 1e3},
        "outputs_equal": equal,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(
        f"{len(weights)} GEMVs: {plain_us:.2f} us each plain, {pdl_us:.2f} with pdl "
        f"({plain_us / pdl_us:.2f}x); outputs equal: {equal}; wrote {args.out}"
    )
    if not equal:
        sys.exit("pdl changed the outputs: a dependence was not respected")


if __name__ == "__main__":
    main()
