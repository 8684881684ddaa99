"""The RMSNorm, add+RMSNorm, RMSNorm+rotary and SiLU-gating Triton kernels equal the torch
layers they replace on CUDA (`RMSNorm.reference`, `apply_rotary`, `F.silu(g) * u`): on CPU in
the Triton interpreter, on a GPU at the 1.7B shapes in bf16 (norm+rotary within two ulps: the
mean's summation order and rsqrt's last bit differ, and an ulp in the normalised value can move
the rotary's rounded sum by one more)."""

from __future__ import annotations

import pytest
import torch

from omniflow.kernels import norm_rope as nr
from omniflow.kernels import silu_mul as sm
from omniflow.kernels.silu_mul import silu_mul
from omniflow.models.layers.norm import RMSNorm
from omniflow.models.layers.rotary import Rotary, apply_rotary, rotate_half
from tests.kernels.interpret import expect_refusal, register, run_checks, run_group_in_child


def make_norm(d: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> RMSNorm:
    norm = RMSNorm(d, eps=1e-6)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(d, generator=g))
    return norm.to(device=device, dtype=dtype)


def tables(positions: torch.Tensor, d: int, dtype: torch.dtype):
    return Rotary(d, 1_000_000.0).cos_sin(positions, dtype)


def tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 8e-3, "rtol": 8e-3}


def check_norm(shape: tuple[int, ...], dtype: torch.dtype, weight_dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(len(shape))
    x = (3 * torch.randn(shape, generator=g)).to(dtype)
    norm = make_norm(shape[-1], weight_dtype)
    got = nr.rms_norm(x, norm.weight, norm.eps)
    want = norm.reference(x)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
    torch.testing.assert_close(got, want, **tol(dtype))


def check_norm_strided() -> None:
    """A non-contiguous view (rows of a wider buffer) reads the right elements."""
    g = torch.Generator().manual_seed(5)
    wide = torch.randn(6, 80, generator=g)
    x = wide[:, 8:56]
    norm = make_norm(48, torch.float32)
    torch.testing.assert_close(nr.rms_norm(x, norm.weight, norm.eps), norm.reference(x))


def check_norm_rope(lead: tuple[int, ...], table_lead: tuple[int, ...], dtype) -> None:
    heads, d = 3, 16
    g = torch.Generator().manual_seed(sum(lead))
    x = (2 * torch.randn(*lead, heads, d, generator=g)).to(dtype)
    positions = torch.randint(0, 500, table_lead, generator=g)
    cos, sin = tables(positions, d, dtype)
    norm = make_norm(d, dtype, seed=1)
    got = nr.rms_norm_rope(x, norm.weight, cos, sin, norm.eps)
    want = apply_rotary(norm.reference(x), cos, sin)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, want, **tol(dtype))


def check_add_norm(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(11)
    x = (2 * torch.randn(shape, generator=g)).to(dtype)
    delta = torch.randn(shape, generator=g).to(dtype)
    norm = make_norm(shape[-1], dtype, seed=4)
    total, normed = nr.add_rms_norm(x, delta, norm.weight, norm.eps)
    assert torch.equal(total, x + delta)  # the residual is exactly torch's sum
    torch.testing.assert_close(normed, norm.reference(x + delta), **tol(dtype))


def check_silu_mul(rows: int, n: int, dtype: torch.dtype) -> None:
    """Both halves of one packed output, read in place (row-strided views)."""
    g = torch.Generator().manual_seed(n)
    packed = (3 * torch.randn(rows, 2 * n, generator=g)).to(dtype)
    gate, up = packed.chunk(2, dim=-1)
    got = silu_mul(gate, up)
    want = torch.nn.functional.silu(gate) * up
    assert got.shape == want.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, **tol(dtype))


def check_refusals() -> None:
    x = torch.randn(2, 3, 16)
    cos, sin = tables(torch.arange(2), 16, torch.float32)
    norm = make_norm(16, torch.float16)
    for args, word in (
        ((x, norm.weight, cos, sin), "dtype"),
        ((x, norm.weight.float(), cos[:1].expand(3, 16), sin[:1].expand(3, 16)), "broadcast"),
    ):
        expect_refusal(nr.rms_norm_rope, (*args, 1e-6), word)


GROUPS = {
    "norm": lambda: [
        ("fp32 [5,48]", lambda: check_norm((5, 48), torch.float32, torch.float32)),
        ("fp16 [2,3,64]", lambda: check_norm((2, 3, 64), torch.float16, torch.float16)),
        ("fp16 x, fp32 weight", lambda: check_norm((4, 32), torch.float16, torch.float32)),
        ("strided rows", check_norm_strided),
    ],
    "norm_rope": lambda: [
        ("decode [B,H,D], tables [B,D]", lambda: check_norm_rope((4,), (4,), torch.float32)),
        ("frames [B,L,H,D], tables [L,D]", lambda: check_norm_rope((3, 2), (2,), torch.float32)),
        ("fp16", lambda: check_norm_rope((5,), (5,), torch.float16)),
        ("refusals", check_refusals),
    ],
    "add_norm_silu": lambda: [
        ("add+norm fp32", lambda: check_add_norm((3, 40), torch.float32)),
        ("add+norm fp16 [2,2,64]", lambda: check_add_norm((2, 2, 64), torch.float16)),
        ("silu*mul fp32, two column blocks", lambda: check_silu_mul(3, 1500, torch.float32)),
        ("silu*mul fp16", lambda: check_silu_mul(4, 48, torch.float16)),
    ],
}


register(__name__, ["all"])


def run_interpreted(group: str) -> int:
    """Child entry point (see tests/kernels/interpret.py): every group in one child (each
    child pays ~3 s of imports; `run_checks` names every failing check)."""
    kernels = (nr._rms_norm_kernel, nr._rms_norm_rope_kernel)
    kernels += (sm._silu_mul_kernel,)
    checks = [c for name in sorted(GROUPS) for c in GROUPS[name]()]
    return run_checks(group, kernels, checks)


def test_kernels_match_the_torch_layers_in_triton_interpreter():
    run_group_in_child("tests.kernels.test_norm_rope", "all")


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [1, 32, 128])
def test_cuda_bf16_real_shapes(rows):
    dev, bf16 = "cuda", torch.bfloat16
    g = torch.Generator(dev).manual_seed(rows)
    x = torch.randn(rows, 2048, generator=g, device=dev, dtype=bf16) * 4
    norm = make_norm(2048, bf16, dev)
    torch.testing.assert_close(norm(x), norm.reference(x), atol=0.07, rtol=8e-3)
    q = torch.randn(rows, 16, 128, generator=g, device=dev, dtype=bf16)
    cos, sin = tables(torch.arange(rows, device=dev) * 37, 128, bf16)
    qn = make_norm(128, bf16, dev, seed=2)
    got = nr.rms_norm_rope(q, qn.weight, cos, sin, qn.eps)
    want = apply_rotary(qn.reference(q), cos, sin)
    torch.testing.assert_close(got, want, atol=0.07, rtol=8e-3)
    # In ulps of the rotary's operands: where x*cos and rot(x)*sin cancel, one ulp of the
    # normalised value is many ulps of the small sum, and no more than that is meaningful.
    y = qn.reference(q).float()
    scale = y.abs() * cos.float().abs()[:, None] + rotate_half(y).abs() * sin.float().abs()[:, None]
    assert_within_ulps(got, want, scale, 2)


def assert_within_ulps(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor, ulps: int):
    """|got - want| <= ulps bf16 units in the last place of `scale` (the operands' size)."""
    exponent = torch.floor(torch.log2(scale.clamp_min(2.0**-30)))
    ulp = torch.exp2(exponent - 7)
    worst = ((got.float() - want.float()).abs() / ulp).max().item()
    assert worst <= ulps, f"{worst:.1f} ulps apart"
