"""The speech tokenizer's encoder: 24 kHz audio -> 16-codebook codes at 12.5 Hz.

The 12 Hz tokenizer's encoder is a Mimi encoder (`speech_tokenizer/` tensors `encoder.*`,
its config `encoder_config`): a causal SEANet convolution stack down to 25 Hz (ELU, residual
blocks, strided convolutions), a causal transformer (LayerNorm, RoPE, GELU MLP, layer
scales), a strided convolution to 12.5 Hz, and a split residual vector quantizer (one
semantic codebook, then the acoustic ones) of which the first 16 codes are kept
(`encoder_valid_num_quantizers`). Module names follow the checkpoint, so
`CodecEncoderWeights` loads name for name.

As the official implementation runs it (transformers 4.57's Mimi, not streaming), the
transformer attends causally over the whole reference (its `sliding_window` of 250 frames
at 25 Hz is not applied), and codes are nearest codebook entries by `torch.cdist`, so equal
inputs give equal codes. Not wired into serving yet: voice clone will use it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from omniflow.models.layers.rotary import apply_rotary
from omniflow.models.qwen3_tts.loader import CheckpointError, load_state, weight_files
from omniflow.models.shapes import CodecEncoderConfig, CodecShape


class CodecEncoderShape(CodecEncoderConfig):
    """`encoder_config` (Mimi) of the speech tokenizer: the preset schema's fields and
    defaults (the Mimi config class's), with the rates the encoder derives from them and
    its shapes for the tiny preset and from a checkpoint's config.json.
    `valid_quantizers` is `encoder_valid_num_quantizers`: codes kept per frame (the
    talker's codebooks)."""

    @property
    def encodec_frame_rate(self) -> float:
        return self.sampling_rate / math.prod(self.upsampling_ratios)

    @property
    def samples_per_frame(self) -> int:
        return round(self.sampling_rate / self.frame_rate)

    @classmethod
    def toy(cls, codec: CodecShape) -> CodecEncoderShape:
        """The tiny preset's encoder: toy widths over the codec's codebooks (dummy weights;
        the reference fixtures use this shape)."""
        return cls(
            num_filters=4,
            hidden_size=codec.hidden_size,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=codec.hidden_size // 2,
            intermediate_size=2 * codec.hidden_size,
            codebook_size=codec.codebook_size,
            codebook_dim=codec.codebook_dim,
            vector_quantization_hidden_dimension=codec.codebook_dim,
            valid_quantizers=codec.num_quantizers,
        )

    @classmethod
    def from_config(cls, cfg: dict) -> CodecEncoderShape:
        """The shape a speech_tokenizer config.json states (absent keys: defaults)."""
        enc = cfg.get("encoder_config", {})
        known = set(cls.model_fields)
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in enc.items() if k in known}
        kw["valid_quantizers"] = cfg.get("encoder_valid_num_quantizers", 16)
        fixed = {"audio_channels": 1, "use_causal_conv": True, "pad_mode": "constant"}
        fixed |= {"use_conv_shortcut": False, "hidden_act": "gelu", "attention_bias": False}
        for key, value in fixed.items():
            if enc.get(key, value) != value:
                raise CheckpointError(
                    f"the checkpoint's encoder_config.{key} is {enc[key]!r}; the codec encoder "
                    f"computes only {value!r}"
                )
        return cls(**kw)


class CausalConv(nn.Module):
    """Mimi's causal convolution: left padding (kernel - stride), right padding up to a
    whole number of strides, zeros (or the edge value with `replicate`)."""

    def __init__(self, c_in, c_out, k, stride=1, dilation=1, bias=True, pad_mode="constant"):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, k, stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.kernel = (k - 1) * dilation + 1
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = self.kernel - self.stride
        length = x.shape[-1]
        frames = math.ceil((length - self.kernel + pad) / self.stride + 1) - 1
        extra = frames * self.stride + self.kernel - pad - length
        return self.conv(F.pad(x, (pad, extra), mode=self.pad_mode))


class ResnetBlock(nn.Module):
    def __init__(self, dim: int, s: CodecEncoderShape, dilation: int) -> None:
        super().__init__()
        hidden = dim // s.compress
        self.block = nn.ModuleList(
            [
                nn.ELU(),
                CausalConv(dim, hidden, s.residual_kernel_size, dilation=dilation),
                nn.ELU(),
                CausalConv(hidden, dim, 1),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


class SEANetEncoder(nn.Module):
    """audio [B, 1, N] -> [B, hidden, frames at 25 Hz]."""

    def __init__(self, s: CodecEncoderShape) -> None:
        super().__init__()
        layers: list[nn.Module] = [CausalConv(1, s.num_filters, s.kernel_size)]
        width = s.num_filters
        for ratio in reversed(s.upsampling_ratios):
            for j in range(s.num_residual_layers):
                layers.append(ResnetBlock(width, s, s.dilation_growth_rate**j))
            layers += [nn.ELU(), CausalConv(width, 2 * width, 2 * ratio, stride=ratio)]
            width *= 2
        layers += [nn.ELU(), CausalConv(width, s.hidden_size, s.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class Attention(nn.Module):
    def __init__(self, s: CodecEncoderShape) -> None:
        super().__init__()
        d, h, kv = s.head_dim, s.num_attention_heads, s.num_key_value_heads
        self.heads, self.kv_heads, self.head_dim = h, kv, d
        self.q_proj = nn.Linear(s.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = apply_rotary(self.q_proj(x).view(b, n, self.heads, self.head_dim), cos, sin)
        k = apply_rotary(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, s: CodecEncoderShape) -> None:
        super().__init__()
        self.fc1 = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.fc2 = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, s: CodecEncoderShape) -> None:
        super().__init__()
        self.self_attn = Attention(s)
        self.mlp = MLP(s)
        self.input_layernorm = nn.LayerNorm(s.hidden_size, eps=s.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(s.hidden_size, eps=s.norm_eps)
        self.self_attn_layer_scale = LayerScale(s.hidden_size)
        self.mlp_layer_scale = LayerScale(s.hidden_size)

    def forward(self, x, cos, sin):
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    def __init__(self, s: CodecEncoderShape) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(s) for _ in range(s.num_hidden_layers))
        self.head_dim, self.theta = s.head_dim, s.rope_theta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] at positions 0..T-1; RoPE as the official computes it (float32)."""
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
        inv_freq = 1.0 / (self.theta**exponent)
        freqs = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1).to(x.device)
        cos, sin = emb.cos().to(x.dtype)[None], emb.sin().to(x.dtype)[None]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class VectorQuantizer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = Codebook(size, dim)


class ResidualQuantizer(nn.Module):
    def __init__(self, s: CodecEncoderShape, n: int) -> None:
        super().__init__()
        vq = s.vector_quantization_hidden_dimension
        self.layers = nn.ModuleList(
            VectorQuantizer(s.codebook_size, s.codebook_dim) for _ in range(n)
        )
        self.input_proj = nn.Conv1d(s.hidden_size, vq, 1, bias=False)
        self.output_proj = nn.Conv1d(vq, s.hidden_size, 1, bias=False)  # decoder side; loaded

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """x [B, hidden, T] -> codes [B, n, T]: nearest entry, subtract, next codebook."""
        residual = self.input_proj(x).transpose(1, 2)
        codes = []
        for layer in self.layers[:n]:
            table = layer.codebook.table()
            flat = residual.reshape(-1, residual.shape[-1])
            idx = torch.cdist(flat[None].float(), table[None].float(), p=2)[0].argmin(dim=-1)
            idx = idx.view(residual.shape[:-1])
            residual = residual - F.embedding(idx, table)
            codes.append(idx)
        return torch.stack(codes, dim=1)


class SplitQuantizer(nn.Module):
    def __init__(self, s: CodecEncoderShape) -> None:
        super().__init__()
        semantic = s.num_semantic_quantizers
        self.semantic = semantic
        self.semantic_residual_vector_quantizer = ResidualQuantizer(s, semantic)
        self.acoustic_residual_vector_quantizer = ResidualQuantizer(s, s.num_quantizers - semantic)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        codes = self.semantic_residual_vector_quantizer.encode(x, self.semantic)
        rest = self.acoustic_residual_vector_quantizer.encode(x, n - self.semantic)
        return torch.cat([codes, rest], dim=1)


class MimiEncoder(nn.Module):
    """speech_tokenizer's `encoder` (the encoding half of a Mimi model)."""

    def __init__(self, s: CodecEncoderShape) -> None:
        super().__init__()
        if s.encodec_frame_rate != 2 * s.frame_rate:
            raise ValueError("the encoder downsamples by 2 after the convolutions")
        if not s.num_semantic_quantizers < s.valid_quantizers <= s.num_quantizers:
            raise ValueError("valid_quantizers must lie between the semantic and all codebooks")
        self.shape = s
        self.encoder = SEANetEncoder(s)
        self.encoder_transformer = Transformer(s)
        self.downsample = CausalConv(
            s.hidden_size, s.hidden_size, 4, 2, bias=False, pad_mode="replicate"
        )
        self.quantizer = SplitQuantizer(s)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        """audio [B, N] at 24 kHz -> codes [B, ceil(N / 1920), valid_quantizers]."""
        h = self.encoder(audio.unsqueeze(1))
        h = self.encoder_transformer(h.transpose(1, 2)).transpose(1, 2)
        codes = self.quantizer.encode(self.downsample(h), self.shape.valid_quantizers)
        frames = -(-audio.shape[-1] // self.shape.samples_per_frame)
        return codes[..., :frames].transpose(1, 2)


class CodecEncoderWeights(nn.Module):
    """Root so that tensor names start with `encoder.` as in speech_tokenizer/."""

    def __init__(self, shape: CodecEncoderShape) -> None:
        super().__init__()
        self.encoder = MimiEncoder(shape)

    @torch.no_grad()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        return self.encoder(audio)


def load_codec_encoder(
    shape: CodecEncoderShape, model_dir: Path | None, seed: int
) -> CodecEncoderWeights:
    """From `model_dir/speech_tokenizer/` (`encoder.*`, strict; its config must state
    `shape`), or seeded dummy weights."""
    weights = CodecEncoderWeights(shape)
    if model_dir is None:
        init_dummy_codec_encoder(weights, seed)
        return weights.eval()
    d = model_dir / "speech_tokenizer"
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{d}: no config.json")
    theirs = CodecEncoderShape.from_config(json.loads(cfg_path.read_text()))
    for name in CodecEncoderShape.model_fields:
        if getattr(theirs, name) != getattr(shape, name):
            raise CheckpointError(
                f"codec encoder {name} is {getattr(shape, name)!r} but the checkpoint's "
                f"speech_tokenizer/config.json states {getattr(theirs, name)!r}"
            )
    load_state(weights, weight_files(d), "encoder.")
    return weights.eval()


@torch.no_grad()
def init_dummy_codec_encoder(module: nn.Module, seed: int) -> None:
    """Deterministic dummy weights (codes of noise, not of speech)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, t in sorted(module.state_dict(keep_vars=True).items()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "bias":
            t.zero_()
        elif leaf in ("cluster_usage", "initialized") or name.endswith("norm.weight"):
            t.fill_(1.0)
        elif leaf == "scale":
            t.fill_(0.01)
        else:
            fan_in = t[0].numel() if t.dim() > 1 else t.numel()
            t.copy_(torch.empty(t.shape).normal_(0.0, 1.0 / fan_in**0.5, generator=gen))
