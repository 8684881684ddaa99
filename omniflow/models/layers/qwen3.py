"""The Qwen3 decoder layer: q/k RMSNorm per head before RoPE, GQA, SwiGLU, no biases.

Attention itself is delegated to an `Attend` callable so the same layer serves the paged
talker (KV in a block pool) and the dense per-frame code predictor. Module and parameter
names follow the published checkpoints, so `state_dict()` keys match them directly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from omniflow.config.schema import TransformerShape
from omniflow.models.layers.norm import RMSNorm
from omniflow.models.layers.rotary import apply_rotary

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(layer index, q [..., Hq, D], k [..., Hkv, D], v [..., Hkv, D]) -> out [..., Hq, D]."""


class Qwen3Attention(nn.Module):
    def __init__(self, shape: TransformerShape, layer_idx: int) -> None:
        super().__init__()
        d, hq, hkv = shape.head_dim, shape.num_heads, shape.num_kv_heads
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = hq, hkv, d
        self.q_proj = nn.Linear(shape.hidden_size, hq * d, bias=False)
        self.k_proj = nn.Linear(shape.hidden_size, hkv * d, bias=False)
        self.v_proj = nn.Linear(shape.hidden_size, hkv * d, bias=False)
        self.o_proj = nn.Linear(hq * d, shape.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, shape.rms_norm_eps)
        self.k_norm = RMSNorm(d, shape.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        if x.is_cuda:
            # One launch per tensor for norm + rotary (Triton; CUDA machines only).
            from omniflow.kernels.norm_rope import rms_norm_rope

            q = rms_norm_rope(q, self.q_norm.weight, cos, sin, self.q_norm.eps)
            k = rms_norm_rope(k, self.k_norm.weight, cos, sin, self.k_norm.eps)
        else:
            q = apply_rotary(self.q_norm(q), cos, sin)
            k = apply_rotary(self.k_norm(k), cos, sin)
        out = attend(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(*lead, self.num_heads * self.head_dim))


class Qwen3MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, shape: TransformerShape, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(shape, layer_idx)
        self.mlp = Qwen3MLP(shape.hidden_size, shape.intermediate_size)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


def run_layers(
    layers: nn.ModuleList, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend
) -> torch.Tensor:
    for layer in layers:
        x = layer(x, cos, sin, attend)
    return x
