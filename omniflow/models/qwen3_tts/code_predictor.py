"""The code predictor: codebooks 1..15 of a frame from the talker's hidden state.

Per frame it prefills `[h, emb0(code0)]`, then runs 14 single-token steps, each feeding the
code it just sampled, over a fresh 16-position dense cache. All rows of a batch move in
lock-step, so the cache is a plain [B, 16, Hkv, D] tensor per layer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from omniflow.config.schema import CodePredictorShape
from omniflow.models.layers.attention import dense_causal_attention
from omniflow.models.layers.qwen3 import run_layers
from omniflow.models.layers.rotary import Rotary
from omniflow.models.qwen3_tts.modules import CodePredictorModule

SampleFn = Callable[[torch.Tensor, int], torch.Tensor]
"""(logits [B, V], codebook index g in 1..15) -> codes [B]."""


class CodePredictor:
    """Runs a `CodePredictorModule` for a batch of frames."""

    def __init__(self, module: CodePredictorModule, shape: CodePredictorShape) -> None:
        self.module = module
        self.shape = shape
        self.rotary = Rotary(shape.head_dim, shape.rope_theta)

    @torch.no_grad()
    def predict(
        self, hidden: torch.Tensor, code0_embed: torch.Tensor, sample: SampleFn
    ) -> torch.Tensor:
        """hidden, code0_embed: [B, talker hidden]. Returns codes 1..15 as [B, 15]."""
        m = self.module
        s = self.shape
        groups = s.num_code_groups
        b = hidden.shape[0]
        caches = [
            (
                hidden.new_zeros(b, groups, s.num_kv_heads, s.head_dim),
                hidden.new_zeros(b, groups, s.num_kv_heads, s.head_dim),
            )
            for _ in range(s.num_layers)
        ]
        x = m.small_to_mtp_projection(torch.stack([hidden, code0_embed], dim=1))
        codes: list[torch.Tensor] = []
        start = 0
        for g in range(1, groups):
            length = x.shape[1]
            positions = torch.arange(start, start + length, device=x.device)
            cos, sin = self.rotary.cos_sin(positions, x.dtype)

            def attend(layer, q, k, v, start=start, length=length):
                kc, vc = caches[layer]
                kc[:, start : start + length] = k
                vc[:, start : start + length] = v
                return dense_causal_attention(q, kc, vc, start)

            out = m.model.norm(run_layers(m.model.layers, x, cos, sin, attend))
            logits = m.lm_head[g - 1](out[:, -1])
            code = sample(logits, g)
            codes.append(code)
            start += length
            if g < groups - 1:
                x = m.small_to_mtp_projection(m.model.codec_embedding[g - 1](code)).unsqueeze(1)
        return torch.stack(codes, dim=1)
