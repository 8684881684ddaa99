"""The streaming codec decoder's CUDA path, with the convolutions' epilogues in our kernels.

Why: at large batches less than half of a window pass of the decoder is convolution
(measured: see docs/performance.md). The rest is full passes over the activations around
them: torch adds a
convolution's bias as a separate broadcast add (its slowest elementwise kernel), a causal
convolution's carried input is joined to the new one by a copy (`torch.cat`), a residual
add reads both operands again, and a transposed convolution's output is copied once to add
its carried overlap and once more to add its bias. Here the convolutions run without their
bias and each of those passes folds into one that runs anyway:

- a residual unit: `snake(x)` is written behind the first convolution's history (no `cat`),
  that convolution's bias goes into the second `snake`, and the second convolution's bias
  into the residual add (`kernels/bias_add.py`);
- a transposed convolution: the carried overlap is added in place to the first few samples,
  and the bias in the one pass that also drops the new overlap tail;
- the last `snake` is written behind the final convolution's history.

The values are the torch path's (`codec_modules`, the CPU's and the reference): in float32
the same sums in the same order (module by module within 1e-5 of the torch path on the CPU,
where sin and the convolutions' own bias differ in the last bits); in bf16 within one
rounding, the carried histories included (the fused bias is added before the one rounding,
where torch rounds twice). `CodecDecoder.stream(fused=True)` takes this path; the
`StreamingDecoder` asks for it on CUDA, where Triton runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn import functional as F

from omniflow.kernels.bias_add import bias_add
from omniflow.kernels.snake_beta import snake_beta

if TYPE_CHECKING:
    from omniflow.models.qwen3_tts.codec_modules import (
        CausalConv,
        CausalTransConv,
        CodecDecoder,
        DecoderBlock,
        ResidualUnit,
        SnakeBeta,
        State,
    )


def convolutions(decoder: CodecDecoder, h: torch.Tensor, state: State) -> torch.Tensor:
    """`CodecDecoder.stream` after its transformer: the upsampling stages, the decoder blocks
    and the last activation and convolution (the caller clamps)."""
    for trans, block in decoder.upsample:
        h = block.stream(trans_conv(trans, h, state), state)
    first, *blocks, act, last = decoder.decoder
    h = first.stream(h, state)
    for block in blocks:
        h = decoder_block(block, h, state)
    return last.conv(activate_into(act, h, last, state))


def decoder_block(block: DecoderBlock, x: torch.Tensor, state: State) -> torch.Tensor:
    """`DecoderBlock.stream`: its activation, its transposed convolution, its residual
    units."""
    act, trans, *units = block.block
    h = trans_conv(trans, snake_beta(x, act.alpha, act.beta), state)
    for unit in units:
        h = residual_unit(unit, h, state)
    return h


def activate_into(
    act: SnakeBeta,
    x: torch.Tensor,
    conv: CausalConv,
    state: State,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`conv`'s whole input: its carried history, then `act(x + bias)`; the history in
    `state` moves on to the last samples of it, as `CausalConv.stream` moves it."""
    if not conv.history:
        return snake_beta(x, act.alpha, act.beta, bias=bias)
    h = snake_beta(x, act.alpha, act.beta, bias=bias, history=state[conv.path])
    state[conv.path] = h[..., -conv.history :]
    return h


def conv_unbiased(conv: CausalConv, h: torch.Tensor) -> torch.Tensor:
    """`conv` over an input that already holds its history, without the bias."""
    c = conv.conv
    return F.conv1d(h, c.weight, None, c.stride, 0, c.dilation, c.groups)


def residual_unit(unit: ResidualUnit, x: torch.Tensor, state: State) -> torch.Tensor:
    """`ResidualUnit.stream`: x + conv2(act2(conv1(act1(x)))), in four launches beside the
    two convolutions' (see the module docstring)."""
    c1, c2 = unit.conv1, unit.conv2
    h = conv_unbiased(c1, activate_into(unit.act1, x, c1, state))
    h = activate_into(unit.act2, h, c2, state, bias=c1.conv.bias)
    y = conv_unbiased(c2, h)
    if c2.conv.bias is None:
        return x + y
    return bias_add(y, c2.conv.bias, residual=x)


def trans_conv(conv: CausalTransConv, x: torch.Tensor, state: State) -> torch.Tensor:
    """`CausalTransConv.stream`: the carried overlap added in place to the first samples,
    and the bias in the pass that leaves the new overlap tail behind."""
    y = F.conv_transpose1d(x, conv.conv.weight, None, stride=conv.stride)
    n = x.shape[-1] * conv.stride
    if conv.overlap:
        y[..., : conv.overlap] += state[conv.path]
        state[conv.path] = y[..., n:]
    bias = conv.conv.bias
    out = y[..., :n]
    return out.contiguous() if bias is None else bias_add(out, bias)
