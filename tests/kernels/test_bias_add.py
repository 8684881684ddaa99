"""The bias-add Triton kernel (`kernels/bias_add.py`) equals torch's `residual + (x + bias)`:
on the CPU in the Triton interpreter, on a GPU at the decoder's shapes."""

from __future__ import annotations

import pytest
import torch
import triton

from omniflow.kernels import bias_add as ba
from tests.kernels.interpret import expect_refusal, register, run_checks, run_group_in_child


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def check(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None) -> None:
    """float32: bit for bit torch's sums, in torch's order. bf16: one rounding at the store
    against torch's two, so within one bf16 step of the float32 sums."""
    got = ba.bias_add(x, bias, residual)
    assert got.shape == x.shape and got.dtype == x.dtype and got.is_contiguous()
    if x.dtype == torch.float32:
        want = x + bias[None, :, None]
        want = want if residual is None else residual + want
        assert torch.equal(got, want), float((got - want).abs().max())
        return
    want = x.float() + bias.float()[None, :, None]
    want = want if residual is None else residual.float() + want
    torch.testing.assert_close(got.float(), want.to(x.dtype).float(), atol=1e-2, rtol=2**-7)


def check_cases() -> None:
    check(randn(2, 5, 700, seed=1), randn(5, seed=2), None)  # several blocks, a partial one
    check(randn(2, 5, 700, seed=1), randn(5, seed=2), randn(2, 5, 700, seed=3))
    wide = randn(3, 4, 40, seed=4)
    check(wide[..., :32], randn(4, seed=5), randn(3, 4, 32, seed=6))  # rows of a wider buffer
    check(wide[..., 8:], randn(4, seed=5), None)  # a view that starts inside its row
    check(randn(2, 9, 4, seed=7).transpose(1, 2), randn(4, seed=8), None)  # not row-major
    check(randn(2, 1, 30, seed=9)[..., :20], randn(1, seed=10), None)  # one channel
    bf = torch.bfloat16
    x, b, r = (
        randn(2, 6, 50, seed=11, dtype=bf),
        randn(6, seed=12, dtype=bf),
        randn(2, 6, 50, seed=13, dtype=bf),
    )
    check(x, b, r)
    big = randn(2, 6, 40, seed=14)
    check(big[:, :4, :32], randn(4, seed=15), None)  # a channel slice: rows not evenly spaced
    check(randn(2, 3, 10, seed=16), randn(3, 2, seed=17)[:, 0], None)  # a strided bias
    empty = ba.bias_add(torch.zeros(2, 3, 0), torch.zeros(3))
    assert empty.shape == (2, 3, 0)


def check_wide_offsets() -> None:
    """The 64-bit-offset variant (taken from 2**31 elements, too large to test) gives the
    32-bit one's values, on a strided view with a residual."""
    y, bias, res = randn(2, 5, 307, seed=18), randn(5, seed=19), randn(2, 5, 300, seed=20)
    x = y[..., :300]
    outs = []
    for wide in (False, True):
        out = torch.empty_like(res)
        grid = (triton.cdiv(out.numel(), ba.BLOCK),)
        ba._bias_add_kernel[grid](
            x, bias, res, out, out.numel(), 5, 300, 307, BLOCK=ba.BLOCK, WIDE=wide, HAS_RES=True
        )
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[1], res + (x + bias[None, :, None]))


def check_refusals() -> None:
    x = torch.zeros(2, 3, 8)
    expect_refusal(ba.bias_add, (x, torch.zeros(4)), "[C]")
    expect_refusal(ba.bias_add, (x[0], torch.zeros(3)), "[B, C, T]")
    expect_refusal(ba.bias_add, (x, torch.zeros(3), torch.zeros(2, 3, 7)), "residual")
    expect_refusal(ba.bias_add, (x, torch.zeros(3), x.double()), "residual")


register(__name__, ["bias_add"])


def run_interpreted(group: str) -> int:
    checks = [
        ("shapes, views, dtypes", check_cases),
        ("64-bit offsets", check_wide_offsets),
        ("refusals", check_refusals),
    ]
    return run_checks(group, (ba._bias_add_kernel,), checks)


def test_kernel_matches_torch_in_triton_interpreter():
    run_group_in_child("tests.kernels.test_bias_add", "bias_add")


@pytest.mark.cuda
@pytest.mark.parametrize(("rows", "channels", "length"), [(1, 768, 32), (128, 96, 15360)])
def test_cuda_decoder_shapes(rows, channels, length):
    g = torch.Generator("cuda").manual_seed(channels)
    y = torch.randn(rows, channels, length + 3, generator=g, device="cuda")
    bias = torch.randn(channels, generator=g, device="cuda")
    res = torch.randn(rows, channels, length, generator=g, device="cuda")
    check(y[..., :length], bias, res)
    check(y[..., :length].bfloat16(), bias.bfloat16(), res.bfloat16())
