"""The codec decoder's pre-transformer (8 layers over the 12.5 Hz latents, a sliding KV window),
named like `speech_tokenizer/`'s checkpoint, and the carried-state types the decoder's modules
share (`codec_modules.py`: the convolutions around it).

As there, `forward` is the full-sequence reference and `stream` continues from carried state
(each layer's last `sliding_window` keys and values), reproducing the full decode exactly.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from omniflow.models.layers.norm import RMSNorm
from omniflow.models.layers.rotary import Rotary, apply_rotary
from omniflow.models.shapes import CodecShape

State = dict[str, torch.Tensor]
"""Per-module carried tensors of a batch of requests, keyed by module path."""


class CosSin(Protocol):
    """Where the streaming transformer takes its RoPE from: `Rotary`, or a capture-safe
    source with the same signature and the same values."""

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class CodecAttention(nn.Module):
    def __init__(self, shape: CodecShape):
        super().__init__()
        kv = shape.num_kv_heads or shape.num_heads
        d = shape.head_dim
        self.heads, self.kv_heads, self.head_dim = shape.num_heads, kv, d
        self.window = shape.sliding_window
        self.q_proj = nn.Linear(shape.hidden_size, shape.num_heads * d, bias=False)
        self.k_proj = nn.Linear(shape.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(shape.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(shape.num_heads * d, shape.hidden_size, bias=False)
        self.path = ""

    def _qkv(self, x, cos, sin):
        b, n, _ = x.shape
        q = apply_rotary(self.q_proj(x).view(b, n, self.heads, self.head_dim), cos, sin)
        k = apply_rotary(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim)
        return q, k, v

    def _attend(self, q, k, v, mask):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask[:, None],
            enable_gqa=True,
        )
        b, _, n, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))

    def forward(self, x, cos, sin) -> torch.Tensor:
        q, k, v = self._qkv(x, cos, sin)
        n = x.shape[1]
        i = torch.arange(n, device=x.device)
        mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - self.window)
        return self._attend(q, k, v, mask.expand(x.shape[0], n, n))

    def stream(self, x, cos, sin, pos: torch.Tensor, state: State) -> torch.Tensor:
        """x [B, n, H] at positions pos[b] .. pos[b]+n-1; the ring holds the previous
        `window` keys/values in position order (entries before position 0 are masked)."""
        q, k, v = self._qkv(x, cos, sin)
        w, n = self.window, x.shape[1]
        k_all = torch.cat([state[self.path + ".k"], k], dim=1)
        v_all = torch.cat([state[self.path + ".v"], v], dim=1)
        state[self.path + ".k"] = k_all[:, -w:]
        state[self.path + ".v"] = v_all[:, -w:]
        kp = pos[:, None] - w + torch.arange(w + n, device=x.device)[None, :]
        qp = pos[:, None] + torch.arange(n, device=x.device)[None, :]
        mask = (kp[:, None, :] >= 0) & (kp[:, None, :] <= qp[:, :, None])
        mask &= kp[:, None, :] > qp[:, :, None] - w
        return self._attend(q, k_all, v_all, mask)


class CodecMLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x):
        return self.scale * x


class CodecLayer(nn.Module):
    def __init__(self, shape: CodecShape):
        super().__init__()
        h = shape.hidden_size
        self.self_attn = CodecAttention(shape)
        self.mlp = CodecMLP(h, shape.intermediate_size)
        self.input_layernorm = RMSNorm(h, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, shape.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(h, shape.layer_scale)
        self.mlp_layer_scale = LayerScale(h, shape.layer_scale)

    def _mlp(self, x):
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))

    def forward(self, x, cos, sin):
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return self._mlp(x)

    def stream(self, x, cos, sin, pos, state: State):
        a = self.self_attn.stream(self.input_layernorm(x), cos, sin, pos, state)
        return self._mlp(x + self.self_attn_layer_scale(a))


class PreTransformer(nn.Module):
    def __init__(self, shape: CodecShape):
        super().__init__()
        self.layers = nn.ModuleList(CodecLayer(shape) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.input_proj = nn.Linear(shape.latent_dim, shape.hidden_size)
        self.output_proj = nn.Linear(shape.hidden_size, shape.latent_dim)
        self.rotary = Rotary(shape.head_dim, shape.rope_theta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, latent] at positions 0..T-1."""
        h = self.input_proj(x)
        cos, sin = self.rotary.cos_sin(torch.arange(x.shape[1], device=x.device), h.dtype)
        for layer in self.layers:
            h = layer(h, cos[None], sin[None])
        return self.output_proj(self.norm(h))

    def stream(
        self, x: torch.Tensor, pos: torch.Tensor, state: State, rope: CosSin | None = None
    ) -> torch.Tensor:
        """x [B, n, latent] at positions pos[b] .. pos[b]+n-1; RoPE from `rope` when given
        (a capture-safe source), else from this transformer's `rotary`."""
        h = self.input_proj(x)
        positions = pos[:, None] + torch.arange(x.shape[1], device=x.device)[None, :]
        source: CosSin = self.rotary if rope is None else rope
        cos, sin = source.cos_sin(positions, h.dtype)
        for layer in self.layers:
            h = layer.stream(h, cos, sin, pos, state)
        return self.output_proj(self.norm(h))
