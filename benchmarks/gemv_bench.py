"""cuBLAS (`F.linear`) vs the Triton skinny GEMM at the Qwen3-TTS 1.7B decode shapes, on CUDA.

    OMNIFLOW_COMMIT=$(git rev-parse --short HEAD) python -m benchmarks.gemv_bench --out r.json

For every linear of a decode step (code predictor and talker, bf16 weights [N, K]) and M in
1..32 activation rows, it times cuBLAS and each candidate `SkinnyConfig` (block_n x block_k x
num_warps x split_k, pruned: too few programs for the SMs, register tiles too large or too
small, split-K only where K is long and N gives few slabs), checks each config's output
against F.linear in fp32 once (relative error < 1e-2; a wrong or failing config is reported on
stderr and dropped, the run goes on), and prints a table: shape, M, cuBLAS us, best Triton us,
its config, speedup, and the weight bandwidth both reach. It ends with the best config per
(N, K, M) as a Python dict to paste into the kernel as a tuned table. `--dry-run` lists the
candidate counts without a GPU.

Timing: the weights (4-48 MB) are comparable to the H200's ~50 MB L2, so timing one weight
over and over would measure L2, not HBM. Each case allocates enough distinct random copies of
its weight that they total >= --min-bytes (200 MB by default, at least 20 copies), captures one
call per copy back to back in a CUDA graph (so launch overhead is that of a graph, as in the
served decode step), replays it --reps times timed with CUDA events, and reports the median
microseconds per call. Each call reads a weight last touched >= 200 MB earlier: from HBM.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.nn.functional as F
import triton

from omniflow.kernels import skinny_gemm as sg
from omniflow.kernels.skinny_gemm import SkinnyConfig, skinny_linear

SHAPES: dict[str, tuple[int, int]] = {
    "cp.qkv": (4096, 1024),
    "cp.o": (1024, 2048),
    "cp.gate_up": (6144, 1024),
    "cp.down": (1024, 3072),
    "cp.lm_head": (2048, 1024),
    "cp.in_proj": (1024, 2048),
    "talker.qkv": (4096, 2048),
    "talker.o": (2048, 2048),
    "talker.gate_up": (12288, 2048),
    "talker.down": (2048, 6144),
    "talker.codec_head": (3072, 2048),
}
MS = (1, 2, 4, 8, 16, 32)
MAX_REL_ERR = 1e-2

Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def candidates(m: int, n: int, k: int) -> list[SkinnyConfig]:
    """The configs worth timing for one case (the default config always among them)."""
    dot = sg.block_m(m) > sg.FMA_MAX_M
    found = {sg.default_config(m, n, k)}
    for bn in (16, 32, 64) if dot else (8, 16, 32, 64):
        for bk in (128, 256, 512):
            for warps in (4, 8):
                for split in (1, 2, 4):
                    slabs = triton.cdiv(n, bn)
                    if bk > k or slabs * split < sg.NUM_SMS // 2:
                        continue  # fewer programs than half the SMs
                    if split > 1 and (k < 2048 or slabs >= 2 * sg.NUM_SMS or k // split < bk):
                        continue  # split-K only where K is long and N gives few slabs
                    per_thread = bn * bk // (32 * warps)
                    if not dot and not 16 <= per_thread <= 64:
                        continue  # fp32 [bn, bk] tile: spills above, starves below
                    if warps == 8 and bn * bk < 8192 or dot and bn * bk > 16384:
                        continue  # 8 warps only for big tiles; tl.dot's smem stages
                    found.add(SkinnyConfig(bn, bk, warps, split))
    return sorted(found, key=lambda c: (c.split_k, c.block_n, c.block_k, c.num_warps))


def time_per_call(fn: Linear, x: torch.Tensor, weights: torch.Tensor, reps: int) -> float:
    """Median us per call of one CUDA graph holding one call per weight copy."""
    fn(x, weights[0])  # compiles / initialises outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            fn(x, w)
    us = replay_median_us(graph, reps, len(weights))
    del graph
    return us


def replay_median_us(graph: torch.cuda.CUDAGraph, reps: int, calls: int) -> float:
    """Median microseconds per call of a graph holding `calls` calls: one untimed replay,
    then `reps` replays timed with CUDA events."""
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def provenance() -> dict[str, str | None]:
    """When, at which commit and on what a kernel benchmark ran (its report's header)."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": os.environ.get("OMNIFLOW_COMMIT"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm()).item()


def run_case(name: str, n: int, k: int, m: int, weights: torch.Tensor, reps: int) -> dict:
    x = torch.randn(m, k, device=weights.device, dtype=weights.dtype)
    want = F.linear(x.float(), weights[0].float())
    cublas_us = time_per_call(F.linear, x, weights, reps)
    result = {"name": name, "n": n, "k": k, "m": m, "cublas_us": cublas_us}
    result["cublas_rel_err"] = rel_err(F.linear(x, weights[0]), want)
    rows = []
    for cfg in candidates(m, n, k):
        row: dict = {"config": asdict(cfg)}
        rows.append(row)
        try:
            err = rel_err(skinny_linear(x, weights[0], cfg), want)
            row["rel_err"] = err
            if not err < MAX_REL_ERR:
                row["error"] = f"wrong result: relative error {err:.3g}"
            else:
                call = functools.partial(skinny_linear, config=cfg)
                row["us"] = time_per_call(call, x, weights, reps)
        except (triton.TritonError, RuntimeError, ValueError) as err:
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        if "error" in row:
            print(f"DROPPED {name} M={m} {cfg}: {row['error']}", file=sys.stderr, flush=True)
    result["configs"] = rows
    timed = [r for r in rows if "us" in r]
    if timed:
        best = min(timed, key=lambda r: r["us"])
        result["best"] = best
        result["speedup"] = cublas_us / best["us"]
    return result


def table(cases: list[dict]) -> str:
    head = f"{'shape':18} {'N x K':>11} {'M':>3} {'cuBLAS us':>9} {'Triton us':>9} "
    head += f"{'speedup':>7} {'TB/s cuBLAS':>11} {'TB/s Triton':>11}  best config"
    lines = [head]
    for c in cases:
        mb = c["n"] * c["k"] * 2 / 1e6
        best = c.get("best")
        t_us = f"{best['us']:9.2f}" if best else f"{'-':>9}"
        t_bw = f"{mb / best['us']:11.2f}" if best else f"{'-':>11}"
        speed = f"{c['speedup']:7.2f}" if best else f"{'-':>7}"
        cfg = SkinnyConfig(**best["config"]) if best else "none passed"
        lines.append(
            f"{c['name']:18} {c['n']:>5}x{c['k']:<5} {c['m']:>3} {c['cublas_us']:9.2f} {t_us} "
            f"{speed} {mb / c['cublas_us']:11.2f} {t_bw}  {cfg}"
        )
    return "\n".join(lines)


def tuned_table(cases: list[dict]) -> str:
    """The best config per (N, K, M) as Python source for the kernel module."""
    lines = ["TUNED: dict[tuple[int, int, int], SkinnyConfig] = {"]
    for c in cases:
        if "best" not in c:
            continue
        cfg = SkinnyConfig(**c["best"]["config"])
        note = f"{c['best']['us']:.2f} us vs cuBLAS {c['cublas_us']:.2f} us"
        lines.append(f"    ({c['n']}, {c['k']}, {c['m']}): {cfg!r},  # {note}")
    lines.append("}")
    return "\n".join(lines)


def dry_run(names: list[str], ms: list[int]) -> None:
    total = 0
    for name in names:
        n, k = SHAPES[name]
        counts = [len(candidates(m, n, k)) for m in ms]
        total += sum(counts)
        print(f"{name:18} {n}x{k}: candidates per M {dict(zip(ms, counts, strict=True))}")
    print(f"{total} configs in all")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="gemv_bench.json", help="JSON file for all numbers")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--m", type=int, nargs="+", default=list(MS))
    ap.add_argument("--reps", type=int, default=15, help="timed graph replays per config")
    ap.add_argument("--min-bytes", type=float, default=200e6, help="weight copies in total")
    ap.add_argument("--dry-run", action="store_true", help="list candidate counts, no GPU")
    args = ap.parse_args()
    if args.dry_run:
        dry_run(args.shapes, args.m)
        return
    if not torch.cuda.is_available():
        sys.exit("gemv_bench needs a CUDA GPU (try --dry-run)")
    started = time.monotonic()
    cases = []
    for name in args.shapes:
        n, k = SHAPES[name]
        copies = max(20, math.ceil(args.min_bytes / (n * k * 2)))
        weights = torch.randn(copies, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        for m in args.m:
            case = run_case(name, n, k, m, weights, args.reps)
            cases.append(case)
            best = case.get("best", {}).get("us", float("nan"))
            print(
                f"[{time.monotonic() - started:6.1f}s] {name} M={m}: cuBLAS {case['cublas_us']:.2f}"
                f" us, Triton {best:.2f} us ({len(case['configs'])} configs)",
                flush=True,
            )
        del weights
        torch.cuda.empty_cache()
    report = {
        **provenance(),
        "method": {"min_bytes": args.min_bytes, "reps": args.reps, "stat": "median us/call"},
        "cases": cases,
        "tuned_table": tuned_table(cases),
        "seconds": time.monotonic() - started,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(report["tuned_table"])
    print(table(cases))
    print(f"wrote {args.out} ({report['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
