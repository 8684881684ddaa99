"""The add + RMSNorm + projection kernel (`kernels.norm_gemv.norm_linear`) equals the two
launches it replaces (`add_rms_norm`, then `skinny_linear`): bit for bit in the Triton
interpreter on the CPU (tails in N and K, with and without the residual add, fp32 and
bf16), near a float64 oracle built on the torch RMSNorm, and its refusals; on a GPU at the
1.7B shapes it folds into, against the two launches."""

from __future__ import annotations

import pytest
import torch

from omniflow.kernels import norm_gemv as ng
from omniflow.kernels.skinny_gemm import SkinnyConfig
from tests.kernels.interpret import expect_refusal, register, run_checks, run_group_in_child


def inputs(n: int, k: int, dtype: torch.dtype, seed: int, device: str = "cpu"):
    g = torch.Generator(device).manual_seed(seed)
    x = (2 * torch.randn(1, k, generator=g, device=device)).to(dtype)
    delta = torch.randn(1, k, generator=g, device=device).to(dtype)
    nw = (1 + 0.5 * torch.randn(k, generator=g, device=device)).to(dtype)
    w = (torch.randn(n, k, generator=g, device=device) / k**0.5).to(dtype)
    return x, delta, nw, w


def reference(x, delta, nw, w, eps):
    """float64 product of the torch RMSNorm (the model's own module) of x + delta."""
    from omniflow.models.layers.norm import RMSNorm

    total = x if delta is None else x + delta
    norm = RMSNorm(x.shape[-1], eps)
    norm.weight.data = nw
    return total, norm.reference(total).double() @ w.double().T


def check_equals_two_launches(
    n: int, k: int, dtype: torch.dtype, config: SkinnyConfig, add: bool
) -> None:
    from omniflow.kernels.norm_rope import add_rms_norm, rms_norm
    from omniflow.kernels.skinny_gemm import skinny_linear

    x, delta, nw, w = inputs(n, k, dtype, seed=n + k)
    d = delta if add else None
    total, got = ng.norm_linear(x, d, nw, 1e-6, w, config)
    if add:
        want_total, h = add_rms_norm(x, delta, nw, 1e-6)
    else:
        want_total, h = x, rms_norm(x, nw, 1e-6)
        assert total is x, "without a delta the residual is x itself"
    want = skinny_linear(h, w, config)
    assert total.shape == x.shape and got.shape == (1, n), (total.shape, got.shape)
    assert torch.equal(total, want_total), (total - want_total).abs().max()
    assert torch.equal(got, want), (got - want).abs().max()
    _, oracle = reference(x, d, nw, w, 1e-6)
    err = ((got.double() - oracle).norm() / oracle.norm()).item()
    assert err < (1e-5 if dtype == torch.float32 else 2e-2), err


def check_leading_dims() -> None:
    """A [1, 1, K] row keeps its leading dims in both results."""
    x, delta, nw, w = inputs(24, 32, torch.float32, seed=5)
    total, out = ng.norm_linear(x.view(1, 1, 32), delta.view(1, 1, 32), nw, 1e-6, w, CFG)
    assert total.shape == (1, 1, 32) and out.shape == (1, 1, 24)
    _, want = reference(x, delta, nw, w, 1e-6)
    assert ((out.view(1, 24).double() - want).norm() / want.norm()).item() < 1e-5


def check_refusals() -> None:
    x, delta, nw, w = inputs(16, 32, torch.float32, seed=7)
    cases = (
        ((x.repeat(2, 1), None, nw, 1e-6, w, CFG), "one row"),
        ((x, delta.half(), nw, 1e-6, w, CFG), "one dtype"),
        ((x, delta, nw[:16], 1e-6, w, CFG), "norm weight"),
        ((x, delta, nw, 1e-6, w, SkinnyConfig(16, 32, 4, 2)), "split-K"),
        ((x, delta, nw, 1e-6, w.T.contiguous().T, CFG), "contiguous along K"),
    )
    for args, word in cases:
        expect_refusal(ng.norm_linear, args, word)


F32, BF16 = torch.float32, torch.bfloat16
CFG = SkinnyConfig(16, 32, 4)
GROUPS = {
    "norm_gemv": lambda: [
        ("fp32 add, N and K tails", lambda: check_equals_two_launches(130, 96, F32, CFG, True)),
        ("fp32 no add", lambda: check_equals_two_launches(64, 96, F32, CFG, False)),
        (
            "bf16 add, even K",
            lambda: check_equals_two_launches(48, 128, BF16, SkinnyConfig(8, 64, 4), True),
        ),
        ("bf16 no add, K tail", lambda: check_equals_two_launches(40, 100, BF16, CFG, False)),
        ("leading dims", check_leading_dims),
        ("refusals", check_refusals),
    ],
}
register(__name__, sorted(GROUPS))


def run_interpreted(group: str) -> int:
    """Child entry point (see tests/kernels/interpret.py)."""
    from omniflow.kernels import norm_rope, skinny_gemm

    kernels = (ng._norm_gemv_kernel, norm_rope._rms_norm_kernel, skinny_gemm._skinny_kernel)
    return run_checks(group, kernels, GROUPS[group]())


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_norm_linear_equals_add_norm_then_skinny_in_triton_interpreter(group):
    run_group_in_child("tests.kernels.test_norm_gemv", group)


# The 1.7B projections that read a norm (N, K): code predictor q/k/v and gate/up, talker's.
FOLDED = [(4096, 1024), (6144, 1024), (4096, 2048), (12288, 2048)]


@pytest.mark.cuda
@pytest.mark.parametrize("add", [True, False])
def test_cuda_bf16_folded_shapes_match_the_two_launches(add):
    """At the 1.7B shapes with their tuned tiles: the residual bit for bit, the product
    within an ulp-level tolerance of add_rms_norm + skinny_linear (the statistics' sum may
    run in another order) and near the float64 oracle; two runs bitwise equal."""
    from omniflow.kernels.norm_rope import add_rms_norm, rms_norm
    from omniflow.kernels.skinny_gemm import TUNED_ONE_ROW, skinny_linear

    for n, k in FOLDED:
        config = TUNED_ONE_ROW[(n, k)]
        x, delta, nw, w = inputs(n, k, BF16, seed=n + k, device="cuda")
        d = delta if add else None
        total, got = ng.norm_linear(x, d, nw, 1e-6, w, config)
        again = ng.norm_linear(x, d, nw, 1e-6, w, config)[1]
        want_total, h = add_rms_norm(x, delta, nw, 1e-6) if add else (x, rms_norm(x, nw, 1e-6))
        want = skinny_linear(h, w, config)
        assert torch.equal(total, want_total), (n, k)
        assert torch.equal(got, again), (n, k, "runs differ")
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
        _, oracle = reference(x.cpu(), None if d is None else d.cpu(), nw.cpu(), w.cpu(), 1e-6)
        err = ((got.cpu().double() - oracle).norm() / oracle.norm()).item()
        assert err < 2e-2, (n, k, err)


@pytest.mark.cuda
def test_cuda_run_norm_linear_folds_one_row_of_a_tuned_unsplit_shape(monkeypatch):
    """`layers.linear.run_norm_linear`: one row of a tuned shape without split-K takes the
    kernel; two rows, a split shape or an untuned one take add_rms_norm then `linear`, with
    the same residual and products within the norm's ulp either way."""
    from omniflow.kernels.norm_rope import add_rms_norm
    from omniflow.kernels.skinny_gemm import TUNED_ONE_ROW
    from omniflow.models.layers.linear import linear, run_norm_linear
    from omniflow.models.layers.norm import RMSNorm

    calls = []
    real = ng.norm_linear

    def spy(*args, **kwargs):
        calls.append(args[4].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(ng, "norm_linear", spy)
    shapes = [*FOLDED, (1024, 3072), (64, 96)]  # (1024, 3072) is split-K; (64, 96) untuned
    for rows in (1, 2):
        for n, k in shapes:
            x, delta, nw, w = inputs(n, k, BF16, seed=n, device="cuda")
            x, delta = x.repeat(rows, 1), delta.repeat(rows, 1)
            norm = RMSNorm(k, 1e-6).to("cuda", BF16)
            norm.weight.data.copy_(nw)
            total, got = run_norm_linear(x, delta, norm, w)
            want_total, h = add_rms_norm(x, delta, nw, 1e-6)
            assert torch.equal(total, want_total), (rows, n, k)
            torch.testing.assert_close(got, linear(h, w), atol=2e-2, rtol=2e-2)
    folded = [s for s in FOLDED if TUNED_ONE_ROW[s].split_k == 1]
    assert calls == folded and len(folded) == len(FOLDED)
