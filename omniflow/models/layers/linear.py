"""`F.linear` that sends one activation row on CUDA to the Triton skinny GEMM, where a
measured config for the weight's shape beats cuBLAS.

Why: at batch 1 every linear of a decode step is a GEMV over a 2-48 MB bf16 weight, and
cuBLAS picks tiles that leave most SMs idle; the code predictor's 1024 x 2048 weights (its
o projection and input projection) are where that costs most, as the predictor runs those 75
and 15 times per frame (measured: see docs/performance.md; `kernels.skinny_gemm.TUNED_ONE_ROW`
lists the shapes). Every
other call (more rows, other shapes, the CPU) is plain `F.linear`. The choice depends on
shapes only, so a CUDA graph records the same kernel each replay.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the skinny GEMM for a tuned single-row case.
    There a bias is added after the product is rounded to the activation dtype (cuBLAS
    rounds once, after the bias): one more rounding, within the dtype's tolerance."""
    if x.is_cuda and x.numel() == x.shape[-1] and x.dtype == weight.dtype:
        # Imported here: Triton is needed on CUDA machines only.
        from omniflow.kernels.skinny_gemm import TUNED_ONE_ROW, skinny_linear

        config = TUNED_ONE_ROW.get((weight.shape[0], weight.shape[1]))
        if config is not None and weight.is_contiguous():
            out = skinny_linear(x, weight, config)
            return out if bias is None else out.add_(bias)
    return F.linear(x, weight, bias)


def run_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` for an `nn.Linear`, through `linear`."""
    return linear(x, module.weight, module.bias)


def run_gated_linear(module: torch.nn.Linear, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`module(silu(gate) * up)` on CUDA (SwiGLU's gating, then the down projection). A single
    row of a tuned weight shape takes one skinny-GEMM launch that gates its input as it loads
    it (the same values as the two launches, bit for bit); otherwise the gating kernel, then
    `run_linear`. The code predictor's 15 steps x 5 layers and the talker's 28 layers make
    this 103 launches fewer per batch-1 frame."""
    # Imported here: Triton is needed on CUDA machines only.
    from omniflow.kernels.silu_mul import silu_mul
    from omniflow.kernels.skinny_gemm import TUNED_ONE_ROW, skinny_linear

    weight = module.weight
    one_row = gate.numel() == gate.shape[-1] and gate.dtype == weight.dtype
    if one_row and module.bias is None and weight.is_contiguous():
        config = TUNED_ONE_ROW.get((weight.shape[0], weight.shape[1]))
        if config is not None:
            return skinny_linear(gate, weight, config, up=up)
    return run_linear(module, silu_mul(gate, up))
