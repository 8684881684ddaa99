"""The SnakeBeta Triton kernel equals `SnakeBeta.reference` (the torch definition it replaces
on CUDA): on the CPU in the Triton interpreter, on a GPU at the decoder's shapes; and the
decoder's SnakeBeta modules take it on CUDA."""

from __future__ import annotations

import pytest
import torch
import triton

from omniflow.kernels import snake_beta as sb
from omniflow.models.qwen3_tts.codec_modules import SnakeBeta
from tests.kernels.interpret import expect_refusal, register, run_checks, run_group_in_child


def make_act(channels: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> SnakeBeta:
    act = SnakeBeta(channels)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        act.alpha.copy_(0.5 * torch.randn(channels, generator=g))
        act.beta.copy_(0.5 * torch.randn(channels, generator=g))
    return act.to(device=device, dtype=dtype)


def check(x: torch.Tensor, act: SnakeBeta) -> None:
    """fp32: equal to the torch definition within sin's last bits. bf16: the kernel computes
    in fp32 and rounds once, where torch in bf16 rounds after every op (rounding x e^alpha
    alone moves sin's phase by up to ~0.06 at |x e^alpha| ~ 30): so it is compared with the
    fp32 definition rounded to bf16, within one bf16 step."""
    got = sb.snake_beta(x, act.alpha, act.beta)
    assert got.shape == x.shape and got.dtype == x.dtype, (got.shape, got.dtype)
    assert got.is_contiguous()
    if x.dtype == torch.float32:
        torch.testing.assert_close(got, act.reference(x), atol=1e-5, rtol=1e-5)
        return
    exact = act.float().reference(x.float())
    act.to(x.dtype)
    torch.testing.assert_close(got.float(), exact.to(x.dtype).float(), atol=1e-2, rtol=2**-7)


def randn(*shape: int, seed: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (3 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(dtype)


def check_cases() -> None:
    check(randn(2, 5, 700), make_act(5, torch.float32))  # two column blocks, a partial one
    check(randn(3, 4, 1, seed=2), make_act(4, torch.float32, seed=1))  # one frame: T = 1
    wide = randn(2, 6, 900, seed=3)
    check(wide[:, :, 100:611], make_act(6, torch.float32, seed=2))  # rows of a wider buffer
    check(randn(2, 300, 7, seed=4).transpose(1, 2), make_act(7, torch.float32, seed=3))
    check(randn(2, 3, 64, seed=5, dtype=torch.bfloat16), make_act(3, torch.bfloat16, seed=4))
    check(randn(4, 1536, 4, seed=6, dtype=torch.bfloat16), make_act(1536, torch.bfloat16, seed=5))
    empty = sb.snake_beta(torch.zeros(2, 3, 0), torch.zeros(3), torch.zeros(3))
    assert empty.shape == (2, 3, 0)


def check_epilogues() -> None:
    """`bias` is added before the activation, `history` written in front: what the torch
    path computes as `cat([history, reference(x + bias)])`, and `history` bit for bit."""
    act = make_act(5, torch.float32, seed=8)
    x, bias, hist = randn(3, 5, 37, seed=9), randn(5, seed=10), randn(3, 5, 18, seed=11)
    want_bias = act.reference(x + bias[None, :, None])
    torch.testing.assert_close(sb.snake_beta(x, act.alpha, act.beta, bias=bias), want_bias)
    got = sb.snake_beta(x, act.alpha, act.beta, bias=bias, history=hist)
    assert got.shape == (3, 5, 18 + 37) and got.is_contiguous()
    assert torch.equal(got[..., :18], hist)
    torch.testing.assert_close(got[..., 18:], want_bias, atol=1e-5, rtol=1e-5)
    got = sb.snake_beta(x, act.alpha, act.beta, history=hist[:, :, 5:11])  # a strided view
    assert torch.equal(got[..., :6], hist[:, :, 5:11])
    torch.testing.assert_close(got[..., 6:], act.reference(x), atol=1e-5, rtol=1e-5)
    one = sb.snake_beta(x[..., :1], act.alpha, act.beta, history=hist)  # one new sample
    torch.testing.assert_close(one[..., 18:], act.reference(x[..., :1]), atol=1e-5, rtol=1e-5)
    strided = torch.stack([bias, -bias], dim=1)[:, 0]  # a bias read at its channel index
    torch.testing.assert_close(sb.snake_beta(x, act.alpha, act.beta, bias=strided), want_bias)
    bf = make_act(5, torch.bfloat16, seed=8)
    xb, bb = x.bfloat16(), bias.bfloat16()
    got = sb.snake_beta(xb, bf.alpha, bf.beta, bias=bb, history=hist.bfloat16())
    assert got.dtype == torch.bfloat16 and torch.equal(got[..., :18], hist.bfloat16())
    exact = bf.float().reference(xb.float() + bb.float()[None, :, None])  # one rounding
    want = exact.bfloat16().float()
    torch.testing.assert_close(got[..., 18:].float(), want, atol=1e-2, rtol=2**-7)


def check_wide_offsets() -> None:
    """The 64-bit-offset variant (taken from 2**31 elements, too large to test) computes the
    same values as the 32-bit one on a small activation."""
    x = randn(2, 5, 300, seed=7)
    act = make_act(5, torch.float32, seed=6)
    outs = []
    for wide in (False, True):
        out = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), sb.BLOCK),)
        sb._snake_beta_kernel[grid](
            x,
            act.alpha,
            act.beta,
            act.alpha,
            x,
            out,
            x.numel(),
            5,
            300,
            0,
            BLOCK=sb.BLOCK,
            WIDE=wide,
            HAS_BIAS=False,
            HAS_HIST=False,
        )
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1], act.reference(x), atol=1e-5, rtol=1e-5)


def check_refusals() -> None:
    x = torch.randn(2, 3, 8)
    expect_refusal(sb.snake_beta, (x, torch.zeros(4), torch.zeros(4)), "[C]")
    expect_refusal(sb.snake_beta, (x[0], torch.zeros(3), torch.zeros(3)), "[B, C, T]")
    z = torch.zeros(3)
    expect_refusal(sb.snake_beta, (x, z, z, torch.zeros(4)), "bias")
    expect_refusal(sb.snake_beta, (x, z, z, None, torch.zeros(2, 4, 6)), "history")
    expect_refusal(sb.snake_beta, (x, z, z, None, torch.zeros(2, 3, 6).double()), "history")


register(__name__, ["snake_beta"])


def run_interpreted(group: str) -> int:
    checks = [
        ("shapes, views, dtypes", check_cases),
        ("bias and history", check_epilogues),
        ("64-bit offsets", check_wide_offsets),
        ("refusals", check_refusals),
    ]
    return run_checks(group, (sb._snake_beta_kernel,), checks)


def test_kernel_matches_the_torch_definition_in_triton_interpreter():
    run_group_in_child("tests.kernels.test_snake_beta", "snake_beta")


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("rows", "channels", "length"), [(1, 1536, 4), (128, 1024, 8), (2, 96, 1920)]
)
def test_cuda_decoder_shapes(rows, channels, length):
    g = torch.Generator("cuda").manual_seed(channels)
    x = 3 * torch.randn(rows, channels, length, generator=g, device="cuda")
    act = make_act(channels, torch.float32, "cuda")
    check(x, act)
    check(x.bfloat16(), make_act(channels, torch.bfloat16, "cuda"))


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("rows", "channels", "length", "history"), [(1, 96, 1920, 54), (128, 96, 480, 6)]
)
def test_cuda_epilogues_at_decoder_shapes(rows, channels, length, history):
    """`bias=` and `history=` at a last-block residual unit's shapes (dilation 9: 54 samples
    of history; a one-frame pass, and 128 rows of a quarter frame)."""
    g = torch.Generator("cuda").manual_seed(history)
    x = 3 * torch.randn(rows, channels, length, generator=g, device="cuda")
    bias = torch.randn(channels, generator=g, device="cuda")
    hist = torch.randn(rows, channels, history, generator=g, device="cuda")
    act = make_act(channels, torch.float32, "cuda")
    got = sb.snake_beta(x, act.alpha, act.beta, bias=bias, history=hist)
    assert got.shape == (rows, channels, history + length)
    assert torch.equal(got[..., :history], hist)
    want = act.reference(x + bias[None, :, None])
    torch.testing.assert_close(got[..., history:], want, atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
def test_the_module_takes_the_kernel_on_cuda(monkeypatch):
    calls = []
    kernel = sb.snake_beta

    def counted(*args):
        calls.append(args[0].shape)
        return kernel(*args)

    monkeypatch.setattr(sb, "snake_beta", counted)
    act = make_act(8, torch.float32, "cuda")
    x = torch.randn(2, 8, 33, device="cuda")
    torch.testing.assert_close(act(x), act.reference(x), atol=1e-5, rtol=1e-5)
    assert calls == [x.shape]
