"""The streaming codec decoder's CUDA path (`models/qwen3_tts/codec_fused.py`: the convolutions'
biases, the causal histories and the residual adds folded into our kernels) equals the torch
path of each module it replaces, output and carried state: on the CPU, its kernels in the
Triton interpreter. On a GPU the whole decoder is compared with the CPU's
(tests/cuda/test_codec_fused_cuda.py)."""

from __future__ import annotations

import torch

from tests.factories import biased_codec_decoder
from tests.kernels.interpret import register, run_checks, run_group_in_child


def random_state(module: torch.nn.Module, rows: int, seed: int) -> dict[str, torch.Tensor]:
    from omniflow.models.qwen3_tts.codec_modules import CausalConv, CausalTransConv

    g = torch.Generator().manual_seed(seed)
    state = {}
    for m in module.modules():
        if isinstance(m, CausalConv | CausalTransConv) and m.state_shape() is not None:
            state[m.path] = torch.randn(rows, *m.state_shape(), generator=g)
    return state


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, (what, got.shape, want.shape)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=what)


def compare(run_fused, run_torch, x: torch.Tensor, module: torch.nn.Module, seed: int) -> None:
    """Both paths from the same input and state: the same output and the same state after."""
    fused_state = random_state(module, x.shape[0], seed)
    torch_state = {k: v.clone() for k, v in fused_state.items()}
    with torch.no_grad():
        got = run_fused(x, fused_state)
        want = run_torch(x, torch_state)
    same(got, want, "output")
    assert fused_state.keys() == torch_state.keys()
    for key in torch_state:
        same(fused_state[key], torch_state[key], f"state {key}")


def check_residual_units_and_trans_convs() -> None:
    from omniflow.models.qwen3_tts import codec_fused
    from omniflow.models.qwen3_tts.codec_modules import DecoderBlock

    dec = biased_codec_decoder()
    blocks = [m for m in dec.decoder if isinstance(m, DecoderBlock)]
    assert blocks
    for i, block in enumerate(blocks):
        _, trans, *units = block.block
        g = torch.Generator().manual_seed(10 + i)
        x = torch.randn(2, trans.conv.in_channels, 3, generator=g)
        compare(
            lambda x, s, m=trans: codec_fused.trans_conv(m, x, s),
            lambda x, s, m=trans: m.stream(x, s),
            x,
            trans,
            seed=20 + i,
        )
        x = torch.randn(2, trans.conv.out_channels, 11, generator=g)
        for j, unit in enumerate(units):
            compare(
                lambda x, s, m=unit: codec_fused.residual_unit(m, x, s),
                lambda x, s, m=unit: m.stream(x, s),
                x,
                unit,
                seed=30 + 3 * i + j,
            )
    for trans, _ in dec.upsample:  # no overlap: no carried state
        x = torch.randn(2, trans.conv.in_channels, 2)
        compare(
            lambda x, s, m=trans: codec_fused.trans_conv(m, x, s),
            lambda x, s, m=trans: m.stream(x, s),
            x,
            trans,
            seed=40,
        )


def check_last_activation_into_the_last_conv() -> None:
    from omniflow.models.qwen3_tts import codec_fused

    dec = biased_codec_decoder()
    act, last = dec.decoder[-2], dec.decoder[-1]
    x = torch.randn(3, last.conv.in_channels, 9, generator=torch.Generator().manual_seed(5))
    compare(
        lambda x, s: last.conv(codec_fused.activate_into(act, x, last, s)),
        lambda x, s: last.stream(act.stream(x, s), s),
        x,
        last,
        seed=50,
    )


register(__name__, ["codec_fused"])


def run_interpreted(group: str) -> int:
    from omniflow.kernels.bias_add import _bias_add_kernel
    from omniflow.kernels.snake_beta import _snake_beta_kernel

    checks = [
        ("residual units and transposed convolutions", check_residual_units_and_trans_convs),
        ("the last activation into the last convolution", check_last_activation_into_the_last_conv),
    ]
    return run_checks(group, (_snake_beta_kernel, _bias_add_kernel), checks)


def test_fused_stream_equals_the_torch_stream_in_triton_interpreter():
    run_group_in_child("tests.kernels.test_codec_fused", "codec_fused")
