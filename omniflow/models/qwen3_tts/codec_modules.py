"""The 12.5 Hz codec decoder (codes -> 24 kHz PCM), named like `speech_tokenizer/`'s checkpoint.

Every stateful module has two paths:
- `forward(x)`: the full-sequence reference (zero left padding, sliding-window mask over the
  whole sequence), used as the test reference;
- `stream(x, state)`: continue from carried state (conv input history, transposed-conv
  overlap carry, KV window), which is what `codec_stream.StreamingDecoder` runs.
Everything is causal, so streaming with carried state reproduces the full decode exactly.

The streaming path is also what a CUDA graph records (`codec_graph.DecoderStepGraphs`): it
reads no value back to the host once its RoPE comes from a `CosSin` source passed in as `rope`
(`Rotary.cos_sin`, the default, reads the largest position to grow its table).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from omniflow.models.qwen3_tts.codec_transformer import (
    CodecAttention,
    CosSin,
    PreTransformer,
    State,
)
from omniflow.models.shapes import CodecShape


class CausalConv(nn.Module):
    """Stride-1 causal conv: output t sees inputs t-(k-1)d .. t."""

    def __init__(self, c_in: int, c_out: int, k: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, k, dilation=dilation, groups=groups)
        self.history = (k - 1) * dilation
        self.path = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.history, 0)))

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        if not self.history:
            return self.conv(x)
        xx = torch.cat([state[self.path], x], dim=-1)
        state[self.path] = xx[..., -self.history :]
        return self.conv(xx)

    def state_shape(self) -> tuple[int, int] | None:
        return (self.conv.in_channels, self.history) if self.history else None


class CausalTransConv(nn.Module):
    """Transposed conv (kernel k, stride s) with the right k-s samples trimmed: the trimmed
    tail is exactly the overlap the next frame adds to, so streaming carries it."""

    def __init__(self, c_in: int, c_out: int, k: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, k, stride=stride)
        self.stride = stride
        self.overlap = k - stride
        self.path = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.overlap] if self.overlap else y

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        if not self.overlap:
            return self.conv(x)
        y = F.conv_transpose1d(x, self.conv.weight, None, stride=self.stride)
        n = x.shape[-1] * self.stride
        carry = state[self.path]
        y = torch.cat([y[..., : self.overlap] + carry, y[..., self.overlap :]], dim=-1)
        state[self.path] = y[..., n:]
        out = y[..., :n]
        bias = self.conv.bias
        return out + bias[None, :, None] if bias is not None else out

    def state_shape(self) -> tuple[int, int] | None:
        return (self.conv.out_channels, self.overlap) if self.overlap else None


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def _pointwise(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h.transpose(1, 2)))))
        return x + (self.gamma * h).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pointwise(x, self.dwconv(x))

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        return self._pointwise(x, self.dwconv.stream(x, state))


class SnakeBeta(nn.Module):
    """x + 1/exp(beta) * sin^2(exp(alpha) x), per channel."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            # One launch instead of seven (Triton; CUDA machines only).
            from omniflow.kernels.snake_beta import snake_beta

            return snake_beta(x, self.alpha, self.beta)
        return self.reference(x)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The torch definition (the CPU path, and what the kernel is tested against)."""
        a = torch.exp(self.alpha)[None, :, None]
        b = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (b + 1e-9)) * torch.sin(x * a).pow(2)

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        return self(x)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        return x + self.conv2.stream(self.act2(self.conv1.stream(self.act1(x), state)), state)


class DecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(c_in), CausalTransConv(c_in, c_out, 2 * rate, rate)]
            + [ResidualUnit(c_out, d) for d in (1, 3, 9)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.block:
            x = m(x)
        return x

    def stream(self, x: torch.Tensor, state: State) -> torch.Tensor:
        for m in self.block:
            x = m.stream(x, state)
        return x


# ------------------------------------------------------------------ quantizer


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        table = self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]
        return F.embedding(codes, table)


class VectorQuantization(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class ResidualVQ(nn.Module):
    def __init__(self, n_q: int, size: int, dim: int, io_dim: int):
        super().__init__()
        self.vq = nn.Module()
        self.vq.layers = nn.ModuleList(VectorQuantization(size, dim) for _ in range(n_q))
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)  # encoder side; kept to load
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T, n_q] -> [B, io_dim, T]."""
        total = None
        for i, layer in enumerate(self.vq.layers):
            e = layer._codebook.decode(codes[..., i])
            total = e if total is None else total + e
        assert total is not None
        return self.output_proj(total.transpose(1, 2))


class SplitResidualVQ(nn.Module):
    def __init__(self, shape: CodecShape):
        super().__init__()
        io = 2 * shape.codebook_dim
        self.rvq_first = ResidualVQ(1, shape.codebook_size, shape.codebook_dim, io)
        self.rvq_rest = ResidualVQ(
            shape.num_quantizers - 1, shape.codebook_size, shape.codebook_dim, io
        )

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[..., :1]) + self.rvq_rest.decode(codes[..., 1:])


# ------------------------------------------------------------------ decoder


class CodecDecoder(nn.Module):
    """speech_tokenizer's `decoder`: codes [B, T, 16] -> PCM [B, T * 1920]."""

    def __init__(self, shape: CodecShape):
        super().__init__()
        self.shape = shape
        self.quantizer = SplitResidualVQ(shape)
        self.pre_conv = CausalConv(2 * shape.codebook_dim, shape.latent_dim, 3)
        self.pre_transformer = PreTransformer(shape)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [
                    CausalTransConv(shape.latent_dim, shape.latent_dim, f, f),
                    ConvNeXtBlock(shape.latent_dim),
                ]
            )
            for f in shape.upsampling_ratios
        )
        dims = [shape.decoder_dim // 2**i for i in range(len(shape.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [CausalConv(shape.latent_dim, shape.decoder_dim, 7)]
            + [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(shape.upsample_rates)]
            + [SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7)]
        )
        self.samples_per_frame = math.prod(shape.upsampling_ratios) * math.prod(
            shape.upsample_rates
        )
        for name, m in self.named_modules():
            if isinstance(m, CausalConv | CausalTransConv | CodecAttention):
                m.path = name

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Full-sequence reference decode."""
        h = self.pre_conv(self.quantizer.decode(codes))
        h = self.pre_transformer(h.transpose(1, 2)).transpose(1, 2)
        for trans, block in self.upsample:
            h = block(trans(h))
        for m in self.decoder:
            h = m(h)
        return h.clamp(-1.0, 1.0).squeeze(1)

    def stream(
        self,
        codes: torch.Tensor,
        pos: torch.Tensor,
        state: State,
        rope: CosSin | None = None,
        fused: bool = False,
    ) -> torch.Tensor:
        """Decode n new frames per row, continuing each row's state; codes [B, n, 16].
        `rope`: see `PreTransformer.stream` (pass a capture-safe source to capture this).
        `fused`: the convolutions' epilogues in our Triton kernels (`codec_fused.py`; the
        CUDA path, chosen once by `StreamingDecoder`), else each module's torch `stream`."""
        h = self.pre_conv.stream(self.quantizer.decode(codes), state)
        h = self.pre_transformer.stream(h.transpose(1, 2), pos, state, rope).transpose(1, 2)
        if fused:  # imported here: Triton is needed on CUDA machines only
            from omniflow.models.qwen3_tts import codec_fused

            h = codec_fused.convolutions(self, h, state)
        else:
            for trans, block in self.upsample:
                h = block.stream(trans.stream(h, state), state)
            for m in self.decoder:
                h = m.stream(h, state)
        return h.clamp(-1.0, 1.0).squeeze(1)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-request carried state: name -> shape (without the batch axis)."""
        shapes: dict[str, tuple[int, ...]] = {}
        s = self.shape
        for m in self.modules():
            if isinstance(m, CausalConv | CausalTransConv):
                shape = m.state_shape()
                if shape is not None:
                    shapes[m.path] = shape
            elif isinstance(m, CodecAttention):
                ring = (s.sliding_window, m.kv_heads, m.head_dim)
                shapes[m.path + ".k"] = ring
                shapes[m.path + ".v"] = ring
        return shapes


class SpeechTokenizerWeights(nn.Module):
    """Root so that parameter names start with `decoder.` as in speech_tokenizer/."""

    def __init__(self, shape: CodecShape):
        super().__init__()
        self.decoder = CodecDecoder(shape)


@torch.no_grad()
def init_dummy_codec(module: nn.Module, seed: int) -> None:
    """Deterministic dummy codec weights scaled by fan-in, so activations keep a useful size
    through the stack (a noise generator, not speech)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("alpha", "beta", "bias"):
            p.zero_()
        elif leaf == "cluster_usage":
            p.fill_(1.0)
        elif leaf in ("gamma", "scale"):
            p.fill_(0.1)
        elif name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            fan_in = p[0].numel() if p.dim() > 1 else p.numel()
            if "conv.weight" in name and ".upsample." not in name and p.dim() == 3:
                fan_in = p.shape[1] * p.shape[2]
            values = torch.empty(p.shape).normal_(0.0, 0.8 / math.sqrt(fan_in), generator=gen)
            p.copy_(values)
