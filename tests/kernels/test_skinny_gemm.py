"""The skinny GEMM kernel equals `F.linear`: on CPU in the Triton interpreter against a float64
product at tiny shapes (K and N not multiples of the tile, split-K, leading dims, both inner
loops), its refusals; on a GPU at the Qwen3-TTS 1.7B decode shapes in bf16 against F.linear
in fp32, with every output element written and two runs bitwise equal."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from omniflow.kernels import skinny_gemm as sg
from omniflow.kernels.skinny_gemm import SkinnyConfig, skinny_linear
from tests.kernels.interpret import expect_refusal, register, run_checks, run_group_in_child


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def check_product(
    lead: tuple[int, ...], n: int, k: int, dtype: torch.dtype, config: SkinnyConfig | None
) -> None:
    g = torch.Generator().manual_seed(n * 1000 + k + sum(lead))
    x = torch.randn(*lead, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    want = (x.double() @ w.double().T).to(dtype)
    out = torch.full((*lead, n), float("nan"), dtype=dtype)
    got = skinny_linear(x, w, config, out=out)
    assert got.data_ptr() == out.data_ptr() and got.shape == want.shape, got.shape
    assert not got.isnan().any(), "elements left unwritten"
    if dtype == torch.float32:
        err = rel_err(got, want)
        assert err < 1e-5, f"relative error {err:.2e}"
    else:
        # One rounding of an fp32 sum: at most a bf16 ulp or so from the rounded exact value.
        torch.testing.assert_close(got.float(), want.float(), atol=0.05, rtol=1.6e-2)


def check_default_alloc() -> None:
    """Without `out`: a fresh tensor, leading dims restored; a strided x is made contiguous."""
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(2, 3, 96, generator=g)
    x = wide[..., ::2]  # last-dim stride 2
    w = torch.randn(64, 48, generator=g)
    got = skinny_linear(x, w, SkinnyConfig(16, 32, 4))
    assert got.shape == (2, 3, 64)
    assert rel_err(got, x.double() @ w.double().T) < 1e-5


def check_refusals() -> None:
    w = torch.randn(16, 32)
    cases = (
        ((torch.randn(33, 32), w, None), "MAX_M=32"),
        ((torch.randn(2, 32).half(), w, None), "dtype"),
        ((torch.randn(2, 24), w, None), "K=24"),
        ((torch.randn(2, 32), w.T.contiguous().T, None), "unit stride"),
        ((torch.randn(12, 32), w, SkinnyConfig(8, 32, 4)), "block_n/k >= 16"),
        ((torch.randn(2, 32), w, SkinnyConfig(24, 32, 4)), "powers of two"),
    )
    for args, word in cases:
        expect_refusal(skinny_linear, args, word)


def check_gated(n: int, k: int, dtype: torch.dtype, config: SkinnyConfig) -> None:
    """`up=`: the input is silu(gate) * up as `silu_mul` computes it, so the result equals
    the two launches bit for bit (same products, same sums); gate and up are the halves of
    one packed projection output, read in place."""
    from omniflow.kernels.silu_mul import silu_mul

    g = torch.Generator().manual_seed(n + k)
    packed = (3 * torch.randn(1, 2 * k, generator=g)).to(dtype)
    gate, up = packed.chunk(2, dim=-1)
    w = torch.randn(n, k, generator=g).to(dtype)
    got = skinny_linear(gate, w, config, up=up)
    two_launches = skinny_linear(silu_mul(gate, up), w, config)
    assert torch.equal(got, two_launches), (got - two_launches).abs().max()
    # Against float64 of the gated input as `silu_mul` gives it (the Triton interpreter casts
    # fp32 to bf16 by truncation, so torch's own bf16 silu * up differs in many elements).
    want = silu_mul(gate, up).double() @ w.double().T
    assert rel_err(got, want) < (1e-5 if dtype == torch.float32 else 1e-2), rel_err(got, want)


def check_gated_refusals() -> None:
    w = torch.randn(16, 32)
    for gate, up, word in (
        (torch.randn(2, 32), torch.randn(2, 32), "one row"),
        (torch.randn(1, 32), torch.randn(1, 16), "must match"),
    ):
        expect_refusal(partial(skinny_linear, up=up), (gate, w, SkinnyConfig(8, 32, 4)), word)


F32 = torch.float32
BF16 = torch.bfloat16
# One group, one child: the child's imports of torch and triton are most of its time.
GROUPS = {
    "fma_and_dot": lambda: [
        # FMA: up to 8 rows
        ("M=1 fp32 N=130 K=96 (both tails)", lambda: check_product((1,), 130, 96, F32, None)),
        ("M=1 split 3", lambda: check_product((1,), 48, 256, F32, SkinnyConfig(16, 32, 4, 3))),
        ("M=3 fp32 K tail", lambda: check_product((3,), 64, 40, F32, SkinnyConfig(16, 32, 4))),
        ("M=3 split 3", lambda: check_product((3,), 130, 96, F32, SkinnyConfig(32, 16, 4, 3))),
        ("[2,3,K] bf16", lambda: check_product((2, 3), 48, 96, torch.bfloat16, None)),
        ("M=8 fp16", lambda: check_product((8,), 64, 40, torch.float16, None)),
        ("default alloc, strided x", check_default_alloc),
        ("refusals", check_refusals),
        ("gated fp32 N=130 K=96", lambda: check_gated(130, 96, F32, SkinnyConfig(16, 32, 4))),
        (
            "gated bf16 split 3",
            lambda: check_gated(48, 256, torch.bfloat16, SkinnyConfig(8, 32, 4, 3)),
        ),
        ("gated K tail, split 3", lambda: check_gated(130, 100, F32, SkinnyConfig(16, 32, 4, 3))),
        (
            "gated bf16 K tail",
            lambda: check_gated(64, 100, torch.bfloat16, SkinnyConfig(16, 32, 4)),
        ),
        ("gated refusals", check_gated_refusals),
        # tl.dot: M > 8 rows padded to 16 or 32
        ("M=9 fp32 tails", lambda: check_product((9,), 130, 96, F32, SkinnyConfig(32, 32, 4))),
        ("M=12 split 3", lambda: check_product((12,), 48, 256, F32, SkinnyConfig(16, 64, 4, 3))),
        ("M=20 bf16", lambda: check_product((4, 5), 64, 40, torch.bfloat16, None)),
    ],
}


def fix_interpreter_bf16_dot() -> None:
    """The interpreter holds bf16 tensors as their uint16 bits and its `tl.dot` multiplies
    those as integers; widen bf16 operands to fp32 first (exact, as on the GPU's tensor
    cores). In the child only."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def widen(t):
        if t.dtype.scalar != tl.bfloat16:
            return t
        bits = t.data.astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot


register(__name__, sorted(GROUPS))


def run_interpreted(group: str) -> int:
    """Child entry point (see tests/kernels/interpret.py)."""
    fix_interpreter_bf16_dot()
    return run_checks(group, (sg._skinny_kernel, sg._sum_splits_kernel), GROUPS[group]())


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_skinny_linear_matches_float64_product_in_triton_interpreter(group):
    run_group_in_child("tests.kernels.test_skinny_gemm", group)


def test_default_config_spreads_the_weight_over_the_sms():
    """>= 2 programs per SM where N allows, the smallest slab where it does not, tl.dot's
    minimum width above FMA_MAX_M rows, block_k within [128, 512] and never past K's power."""
    assert sg.default_config(1, 12288, 2048).block_n == 32  # 384 programs
    assert sg.default_config(1, 4096, 1024).block_n == 8  # 512 programs
    assert sg.default_config(1, 1024, 3072).block_n == 8  # too few rows for 2 per SM
    assert sg.default_config(16, 1024, 3072).block_n == 16
    for m in (1, 4, 8, 16, 32):
        for n, k in SHAPES:
            cfg = sg.default_config(m, n, k)
            assert 128 <= cfg.block_k <= 512 and cfg.split_k == 1, cfg
    assert sg.default_config(1, 64, 40).block_k == 64


# The Qwen3-TTS 1.7B decode linears (N, K): code predictor, then talker.
SHAPES = [
    (4096, 1024),
    (1024, 2048),
    (6144, 1024),
    (1024, 3072),
    (2048, 1024),
    (4096, 2048),
    (2048, 2048),
    (12288, 2048),
    (2048, 6144),
    (3072, 2048),
]
CUDA_CONFIGS = [None, SkinnyConfig(16, 256, 4, 2), SkinnyConfig(32, 128, 8, 4)]


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("config", CUDA_CONFIGS, ids=str)
def test_cuda_bf16_decode_shapes_match_f_linear(m, config):
    dev, bf16 = "cuda", torch.bfloat16
    g = torch.Generator(dev).manual_seed(m)
    for n, k in SHAPES:
        x = torch.randn(m, k, generator=g, device=dev, dtype=bf16)
        w = torch.randn(n, k, generator=g, device=dev, dtype=bf16) / k**0.5
        want = F.linear(x.float(), w.float())
        outs = []
        for _ in range(2):
            out = torch.full((m, n), float("nan"), device=dev, dtype=bf16)
            skinny_linear(x, w, config, out=out)
            assert not out.isnan().any(), f"{(n, k)}: elements left unwritten"
            outs.append(out)
        err = rel_err(outs[0], want)
        assert err < 1e-2, f"{(n, k)} M={m}: relative error {err:.2e}"
        assert torch.equal(outs[0], outs[1]), f"{(n, k)} M={m}: runs differ"


@pytest.mark.cuda
def test_cuda_model_linear_takes_the_kernel_for_one_row_of_a_tuned_shape(monkeypatch):
    """`layers.linear.linear`: one row of every tuned shape goes through the kernel (bias
    added after) and equals F.linear; two rows, or an untuned shape, stay on cuBLAS."""
    from omniflow.kernels import skinny_gemm
    from omniflow.models.layers.linear import linear

    calls = []
    real = skinny_gemm.skinny_linear

    def spy(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(skinny_gemm, "skinny_linear", spy)
    for n, k in skinny_gemm.TUNED_ONE_ROW:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(1, 1, k, device="cuda", dtype=torch.bfloat16)
        got = linear(x, w, bias)
        want = torch.nn.functional.linear(x.float(), w.float(), bias.float())
        rel = ((got.float() - want).norm() / want.norm()).item()
        assert rel < 1e-2, (n, k, rel)
        assert calls[-1] == (n, k)
        before = len(calls)
        linear(torch.randn(2, k, device="cuda", dtype=torch.bfloat16), w)
        assert len(calls) == before
    untuned = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16)
    linear(torch.randn(1, 96, device="cuda", dtype=torch.bfloat16), untuned)
    assert len(calls) == len(skinny_gemm.TUNED_ONE_ROW)


@pytest.mark.cuda
@pytest.mark.parametrize("lead", [(1,), (1, 1), (3,)])
def test_cuda_mlp_down_projection_gates_in_the_kernel_for_one_row(monkeypatch, lead):
    """`Qwen3MLP` on CUDA (packed gate/up, the 1.7B predictor's and talker's shapes): one row
    takes the gated skinny GEMM, equal bit for bit to the gating kernel then the linear;
    three rows keep the two launches."""
    from omniflow.kernels import skinny_gemm
    from omniflow.kernels.silu_mul import silu_mul
    from omniflow.models.layers.linear import linear, run_linear
    from omniflow.models.layers.qwen3 import Qwen3MLP

    gated = []
    real = skinny_gemm.skinny_linear

    def spy(*args, **kwargs):
        if kwargs.get("up") is not None:
            gated.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(skinny_gemm, "skinny_linear", spy)
    torch.manual_seed(0)
    for hidden, inter in ((1024, 3072), (2048, 6144)):
        mlp = Qwen3MLP(hidden, inter).to("cuda", torch.bfloat16)
        mlp.fuse_projections()
        x = torch.randn(*lead, hidden, device="cuda", dtype=torch.bfloat16)
        got = mlp(x)
        gate, up = linear(x, mlp.gate_up_weight).chunk(2, dim=-1)  # as the layer does
        want = run_linear(mlp.down_proj, silu_mul(gate, up))
        assert torch.equal(got, want), (hidden, (got.float() - want.float()).abs().max())
    assert gated == ([] if lead == (3,) else [(1024, 3072), (2048, 6144)])
