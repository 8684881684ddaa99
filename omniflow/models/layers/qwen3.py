"""The Qwen3 decoder layer: q/k RMSNorm per head before RoPE, GQA, SwiGLU, no biases.

Attention itself is delegated to an `Attend` callable so the same layer serves the paged
talker (KV in a block pool) and the dense per-frame code predictor. Module and parameter
names follow the published checkpoints, so `state_dict()` keys match them directly.

`fuse_projections` (called once the weights are final, on CUDA) packs q/k/v into one weight
and gate/up into another: at decode batch sizes each projection is a latency-bound GEMV, so
seven launches per layer become four. The separate parameters become views into the packed
weights (no extra memory; `state_dict()` and loading see the same names and values).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from omniflow.kernels.args import NormRopeArgs
from omniflow.models.layers.linear import linear, run_gated_linear, run_linear
from omniflow.models.layers.norm import RMSNorm
from omniflow.models.layers.rotary import apply_rotary
from omniflow.models.shapes import TransformerShape

Tensor = torch.Tensor
Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]
"""(layer index, q [..., Hq, D], k [..., Hkv, D], v [..., Hkv, D]) -> out [..., Hq, D]."""


@dataclass(frozen=True)
class PreNormAttend:
    """An attention that applies the q/k norms and the rotary itself, declared by its type:
    the layer hands it q and k as projected, with its two norms and the rotary tables. This
    lets one fused kernel do norms, rotary, cache write and attention (every pass of the code
    predictor on CUDA, `omniflow.kernels.frame_attention`)."""

    fn: Callable[[int, Tensor, Tensor, Tensor, RMSNorm, RMSNorm, Tensor, Tensor], Tensor]
    """(layer index, q, k, v as projected, q_norm, k_norm, cos, sin) -> out [..., Hq, D]."""


AnyAttend = Attend | PreNormAttend

KVCaches = list[tuple[Tensor, Tensor]]
"""One (K, V) pair per layer, in the stack's own layout (the talker's paged block pool, the
code predictor's dense per-frame cache)."""

NormRopeKernel = Callable[[NormRopeArgs], Tensor]
"""(q, k, v as projected; q and k norm weights, their eps; cos, sin; the layer's k_cache,
v_cache, as one `NormRopeArgs`) -> out [..., Hq, D]: a fused kernel that applies the norms
and rotary and writes the cache itself (`kernels.frame_attention`,
`kernels.norm_rope_write`)."""


def fused_norm_rope(caches: KVCaches, kernel: NormRopeKernel) -> PreNormAttend:
    """A `PreNormAttend` that hands `kernel` the layer's norm weights and eps, the rotary
    tables and the layer's K/V caches, so one launch does norms, rotary and cache write."""

    def fn(
        layer: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_norm: RMSNorm,
        k_norm: RMSNorm,
        cos: Tensor,
        sin: Tensor,
    ) -> Tensor:
        kc, vc = caches[layer]
        args = NormRopeArgs(q, k, v, q_norm.weight, k_norm.weight, q_norm.eps, cos, sin, kc, vc)
        return kernel(args)

    return PreNormAttend(fn)


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
        self.qkv_weight: torch.Tensor | None = None
        """q, k and v stacked (set by `fuse_projections`)."""

    def fuse_projections(self) -> None:
        self.qkv_weight = _pack(self.q_proj, self.k_proj, self.v_proj)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lead = x.shape[:-1]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_weight is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            q, k, v = linear(x, self.qkv_weight).split([hq * d, hkv * d, hkv * d], dim=-1)
        return q.view(*lead, hq, d), k.view(*lead, hkv, d), v.view(*lead, hkv, d)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AnyAttend
    ) -> torch.Tensor:
        lead = x.shape[:-1]
        q, k, v = self.project(x)
        if isinstance(attend, PreNormAttend):
            out = attend.fn(self.layer_idx, q, k, v, self.q_norm, self.k_norm, cos, sin)
            return run_linear(self.o_proj, out.reshape(*lead, self.num_heads * self.head_dim))
        if x.is_cuda:
            # One launch per tensor for norm + rotary (Triton; CUDA machines only).
            from omniflow.kernels.norm_rope import rms_norm_rope

            q = rms_norm_rope(q, self.q_norm.weight, cos, sin, self.q_norm.eps)
            k = rms_norm_rope(k, self.k_norm.weight, cos, sin, self.k_norm.eps)
        else:
            q = apply_rotary(self.q_norm(q), cos, sin)
            k = apply_rotary(self.k_norm(k), cos, sin)
        out = attend(self.layer_idx, q, k, v)
        return run_linear(self.o_proj, out.reshape(*lead, self.num_heads * self.head_dim))


class Qwen3MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up_weight: torch.Tensor | None = None
        """gate and up stacked (set by `fuse_projections`)."""

    def fuse_projections(self) -> None:
        self.gate_up_weight = _pack(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_weight is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = linear(x, self.gate_up_weight).chunk(2, dim=-1)
        if x.is_cuda:
            # The gating in Triton, fused into a one-row down projection (CUDA machines only).
            return run_gated_linear(self.down_proj, gate, up)
        return self.down_proj(F.silu(gate) * up)


def _pack(*linears: nn.Linear) -> torch.Tensor:
    """The linears' weights stacked along the output axis; each linear's weight becomes a
    view of its rows, so the packed copy is the only storage and stays in step with them."""
    packed = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    row = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = packed[row : row + n]
        row += n
    return packed


def fuse_projections(module: nn.Module) -> int:
    """Pack the projections of every Qwen3 layer in `module`; returns how many layers."""
    layers = [m for m in module.modules() if isinstance(m, Qwen3DecoderLayer)]
    for layer in layers:
        layer.self_attn.fuse_projections()
        layer.mlp.fuse_projections()
    return len(layers)


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, shape: TransformerShape, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(shape, layer_idx)
        self.mlp = Qwen3MLP(shape.hidden_size, shape.intermediate_size)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AnyAttend
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


def run_layers(
    layers: nn.ModuleList,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    attend: AnyAttend,
) -> torch.Tensor:
    for layer in layers:
        x = layer(x, cos, sin, attend)
    return x


AddNorm = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]
]
"""(x, delta, norm weight, eps) -> (x + delta, RMSNorm(x + delta))."""


def run_layers_norm(
    layers: nn.ModuleList,
    final_norm: RMSNorm,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    attend: AnyAttend,
    add_norm: AddNorm | None = None,
) -> torch.Tensor:
    """`final_norm(run_layers(...))`. On CUDA every residual add is fused with the norm that
    reads it (`add_rms_norm`: the post-attention norm, the next layer's input norm, the final
    norm), which saves two launches per layer; the values are the same roundings. A given
    `add_norm` takes the fused kernel's place (on any device: the tests pass a torch one)."""
    if add_norm is None:
        if not x.is_cuda:
            return final_norm(run_layers(layers, x, cos, sin, attend))
        from omniflow.kernels.norm_rope import add_rms_norm  # Triton: CUDA machines only

        add_norm = add_rms_norm
    h = layers[0].input_layernorm(x)
    for i, layer in enumerate(layers):
        post = layer.post_attention_layernorm
        x, h = add_norm(x, layer.self_attn(h, cos, sin, attend), post.weight, post.eps)
        after = layers[i + 1].input_layernorm if i + 1 < len(layers) else final_norm
        x, h = add_norm(x, layer.mlp(h), after.weight, after.eps)
    return h
