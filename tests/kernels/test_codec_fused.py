"""The streaming codec decoder's CUDA path (`models/qwen3_tts/codec_fused.py`: the convolutions'
biases, the causal histories and the residual adds folded into our kernels) equals the torch
path of each module it replaces and of the whole decoder, output and carried state: on the
CPU, its kernels in the Triton interpreter. On a GPU the whole decoder is compared with the CPU's
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


def same(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 1e-5) -> None:
    assert got.shape == want.shape, (what, got.shape, want.shape)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol, msg=what)


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


def check_whole_decoder() -> None:
    """`CodecDecoder.stream(fused=True)` (every module the CUDA path replaces, and the order it
    runs them in) against `fused=False` over three chunks, PCM and every carried state,
    transformer included."""
    from omniflow.models.qwen3_tts.codec_modules import CodecDecoder

    dec: CodecDecoder = biased_codec_decoder()
    shapes = dec.state_shapes()
    g = torch.Generator().manual_seed(6)
    states = [
        {k: 0.5 * torch.randn(2, *v, generator=g) for k, v in shapes.items()} for _ in range(2)
    ]
    states[1] = {k: v.clone() for k, v in states[0].items()}
    codes = torch.randint(0, 2048, (2, 9, 16), generator=g)
    pos = torch.tensor([0, 30])
    from omniflow.models.qwen3_tts import codec_fused

    calls: list[str] = []
    originals = {n: getattr(codec_fused, n) for n in ("trans_conv", "residual_unit")}
    for name, fn in originals.items():
        setattr(codec_fused, name, lambda *a, n=name, f=fn: calls.append(n) or f(*a))
    try:
        for a, b in ((0, 1), (1, 6), (6, 9)):
            with torch.no_grad():
                got = dec.stream(codes[:, a:b], pos + a, states[0], fused=True)
                assert set(calls) == set(originals), calls  # the fused path ran
                calls.clear()
                want = dec.stream(codes[:, a:b], pos + a, states[1], fused=False)
                assert not calls, calls  # and only where asked for
            # float32 roundings (~1e-7 an op) grow through ~40 convolutions to a few 1e-5; a
            # lost bias or history moves the PCM by ~0.1
            same(got, want, f"PCM of frames {a}..{b}", tol=2e-4)
            assert float(want.std()) > 1e-2  # audio, not silence (the states are unclamped)
    finally:
        for name, fn in originals.items():
            setattr(codec_fused, name, fn)
    for key in shapes:
        same(states[0][key], states[1][key], f"state {key}", tol=2e-4)


register(__name__, ["codec_fused"])


def run_interpreted(group: str) -> int:
    from omniflow.kernels.bias_add import _bias_add_kernel
    from omniflow.kernels.snake_beta import _snake_beta_kernel

    checks = [
        ("residual units and transposed convolutions", check_residual_units_and_trans_convs),
        ("the whole decoder, fused and not", check_whole_decoder),
    ]
    return run_checks(group, (_snake_beta_kernel, _bias_add_kernel), checks)


def test_fused_stream_equals_the_torch_stream_in_triton_interpreter():
    run_group_in_child("tests.kernels.test_codec_fused", "codec_fused")
