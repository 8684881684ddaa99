"""Packed projections (`fuse_projections`, what the talker does on CUDA) compute what the
separate ones do, keep the checkpoint's names and values, and share one storage."""

from __future__ import annotations

import torch

from omniflow.models.layers.qwen3 import Qwen3DecoderLayer, fuse_projections
from omniflow.models.layers.rotary import Rotary
from omniflow.models.qwen3_tts.modules import init_dummy
from omniflow.models.shapes import TransformerShape

SHAPE = TransformerShape(
    num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48
)


def layers() -> torch.nn.ModuleList:
    stack = torch.nn.ModuleList(Qwen3DecoderLayer(SHAPE, i) for i in range(2))
    init_dummy(stack, seed=3, std=0.2)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():  # dummy norms are all ones: give each its own weights
        for name, p in stack.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
    return stack


def run(stack: torch.nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    cos, sin = Rotary(SHAPE.head_dim, SHAPE.rope_theta).cos_sin(torch.arange(x.shape[0]), x.dtype)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def attend(layer, q, k, v):  # keys/values as the layer hands them over, then a plain sdpa
        seen.append((k, v))
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), enable_gqa=True
        )
        return out.transpose(0, 1)

    for layer in stack:
        x = layer(x, cos, sin, attend)
    return x


def test_packed_layers_compute_the_same_and_keep_names_and_storage():
    x = torch.randn(5, SHAPE.hidden_size, generator=torch.Generator().manual_seed(0))
    plain = layers()
    packed = layers()
    before = {k: v.clone() for k, v in packed.state_dict().items()}
    assert fuse_projections(packed) == 2
    after = packed.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    attn = packed[0].self_attn
    assert attn.qkv_weight is not None and attn.qkv_weight.shape == (32 + 16 + 16, 32)
    assert attn.v_proj.weight.data_ptr() == attn.qkv_weight[48:].data_ptr()
    assert packed[1].mlp.gate_up_weight is not None
    torch.testing.assert_close(run(packed, x), run(plain, x), atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # a later in-place load through the old names reaches the packed copy
        packed[1].mlp.up_proj.weight.mul_(0)
        plain[1].mlp.up_proj.weight.mul_(0)
    torch.testing.assert_close(run(packed, x), run(plain, x), atol=1e-5, rtol=1e-5)


def test_fused_stack_pairs_each_residual_add_with_the_norm_that_reads_it():
    """The CUDA layer loop (`run_layers_norm` with `add_norm`) with a torch add+norm equals
    `final_norm(run_layers(...))` exactly: the wiring of residuals to norms is right."""
    from omniflow.models.layers.norm import RMSNorm
    from omniflow.models.layers.qwen3 import run_layers, run_layers_norm

    def add_norm(x, delta, weight, eps):
        total = x + delta
        norm = RMSNorm(total.shape[-1], eps)
        norm.weight.data = weight
        return total, norm.reference(total)

    stack = layers()
    final = RMSNorm(SHAPE.hidden_size)
    with torch.no_grad():
        final.weight.normal_(1.0, 0.3, generator=torch.Generator().manual_seed(9))
    x = torch.randn(5, SHAPE.hidden_size, generator=torch.Generator().manual_seed(1))
    cos, sin = Rotary(SHAPE.head_dim, SHAPE.rope_theta).cos_sin(torch.arange(5), x.dtype)

    def attend(layer, q, k, v):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), enable_gqa=True
        )
        return out.transpose(0, 1)

    with torch.no_grad():
        want = final(run_layers(stack, x, cos, sin, attend))
        got = run_layers_norm(stack, final, x, cos, sin, attend, add_norm)
    assert torch.equal(got, want)
