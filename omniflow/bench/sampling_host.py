"""Host time of preparing one codebook-0 sampling call (`SamplingStaging.prepare`, plus the
history `record`) at a given batch size and history length: what the runner pays per step
before the draw, and whether it grows with the length of the requests.

    python -m omniflow.bench.sampling_host --rows 128 --history 50 500 2000

Runs on the CPU (device tensors on the CPU too, so the figure includes their small ops).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch

from omniflow.core.request import SamplingParams
from omniflow.models.interface import TokenPolicy
from omniflow.sampling.sampler import SamplingStaging


@dataclass
class Row:
    sampling: SamplingParams
    seed: int
    tokens: list[int]
    request_id: str


def per_step_ms(rows: int, history: int, steps: int) -> float:
    policy = TokenPolicy(3072, tuple(range(2048, 3072)), (2150,))
    staging = SamplingStaging(rows, policy, torch.device("cpu"))
    gen = np.random.default_rng(0)
    params = SamplingParams(repetition_penalty=1.05, top_k=50, temperature=0.9)
    batch_rows = [
        Row(params, i, gen.integers(0, 2048, history).tolist(), f"r{i}") for i in range(rows)
    ]
    staging.prepare(batch_rows)  # first sight of each request
    t0 = time.perf_counter()
    for _ in range(steps):
        batch = staging.prepare(batch_rows)
        ids = torch.randint(0, 2048, (rows,))
        staging.record(batch, ids)
        for r, t in zip(batch_rows, ids.tolist(), strict=True):
            r.tokens.append(t)
    return (time.perf_counter() - t0) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--history", type=int, nargs="+", default=[50, 500, 2000])
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    for n in args.history:
        ms = per_step_ms(args.rows, n, args.steps)
        print(f"rows={args.rows} history={n}: {ms:.2f} ms per step")


if __name__ == "__main__":
    main()
