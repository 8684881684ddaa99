"""The code predictor: codebooks 1..15 of a frame from the talker's hidden state.

Per frame it prefills `[h, emb0(code0)]`, then runs 14 single-token steps, each feeding the
code it just sampled, over a fresh 16-position dense cache. All rows of a batch move in
lock-step, so the cache is a plain [B, 16, Hkv, D] tensor per layer.

`predict` is capture-safe (a CUDA graph can record it, `predictor_graph.py`): every shape
and position is a Python int fixed by the batch size, the RoPE tables for positions
0..15 are built once per device and dtype and sliced, and the caller may hand in
preallocated caches. Nothing in it reads a tensor value back to the host; the sampling
callable must keep that promise too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from omniflow.models.layers.attention import dense_causal_attention
from omniflow.models.layers.linear import run_linear
from omniflow.models.layers.qwen3 import AnyAttend, KVCaches, fused_norm_rope, run_layers_norm
from omniflow.models.layers.rotary import Rotary
from omniflow.models.qwen3_tts.modules import CodePredictorModule
from omniflow.models.shapes import CodePredictorShape

SampleFn = Callable[[torch.Tensor, int], torch.Tensor]
"""(logits [B, V], codebook index g in 1..15) -> codes [B]."""

_CosSin = tuple[torch.Tensor, torch.Tensor]


class CodePredictor:
    """Runs a `CodePredictorModule` for a batch of frames."""

    def __init__(self, module: CodePredictorModule, shape: CodePredictorShape) -> None:
        self.module = module
        self.shape = shape
        self.rotary = Rotary(shape.head_dim, shape.rope_theta)
        self._tables: dict[tuple[torch.device, torch.dtype], _CosSin] = {}

    def rope_tables(self, device: torch.device, dtype: torch.dtype) -> _CosSin:
        """cos, sin [num_code_groups, head_dim] for positions 0..15, built on first use.

        Building reads the largest position back to the host (`Rotary.cos_sin`), so a graph
        capture must be preceded by one call here (an eager `predict` does it). The values
        are those `Rotary.cos_sin` gives position by position, so slicing them is exact."""
        key = (device, dtype)
        if key not in self._tables:
            positions = torch.arange(self.shape.num_code_groups, device=device)
            self._tables[key] = self.rotary.cos_sin(positions, dtype)
        return self._tables[key]

    def new_caches(self, batch: int, device: torch.device, dtype: torch.dtype) -> KVCaches:
        """Dense per-frame caches for `batch` rows: one (K, V) pair per layer, each
        [B, num_code_groups, Hkv, D]. Positions are always written before they are read, so
        the zero fill is for tidiness, not correctness."""
        s = self.shape
        size = (batch, s.num_code_groups, s.num_kv_heads, s.head_dim)
        return [
            (
                torch.zeros(size, device=device, dtype=dtype),
                torch.zeros(size, device=device, dtype=dtype),
            )
            for _ in range(s.num_layers)
        ]

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        """The talker-width -> predictor-width projection (none where the widths match)."""
        proj = self.module.small_to_mtp_projection
        return run_linear(proj, x) if isinstance(proj, nn.Linear) else proj(x)

    @torch.no_grad()
    def predict(
        self,
        hidden: torch.Tensor,
        code0_embed: torch.Tensor,
        sample: SampleFn,
        caches: KVCaches | None = None,
    ) -> torch.Tensor:
        """hidden, code0_embed: [B, talker hidden]. Returns codes 1..15 as [B, 15].

        `caches` (from `new_caches`, B rows) are overwritten; None allocates fresh ones."""
        m = self.module
        groups = self.shape.num_code_groups
        if caches is None:
            caches = self.new_caches(hidden.shape[0], hidden.device, hidden.dtype)
        x = self._project(torch.stack([hidden, code0_embed], dim=1))
        cos_all, sin_all = self.rope_tables(x.device, x.dtype)
        codes: list[torch.Tensor] = []
        start = 0
        for g in range(1, groups):
            length = x.shape[1]
            cos = cos_all[start : start + length]
            sin = sin_all[start : start + length]

            attend = _attend(caches, start, length, x.is_cuda)
            out = run_layers_norm(m.model.layers, m.model.norm, x, cos, sin, attend)
            logits = run_linear(m.lm_head[g - 1], out[:, -1])
            code = sample(logits, g)
            codes.append(code)
            start += length
            if g < groups - 1:
                x = self._project(m.model.codec_embedding[g - 1](code)).unsqueeze(1)
        return torch.stack(codes, dim=1)


def _attend(caches: KVCaches, start: int, length: int, cuda: bool) -> AnyAttend:
    """The attention for one pass over positions start..start+length-1. On CUDA every pass is
    one fused launch per token and layer (`kernels.frame_attention`: norms, rotary, cache
    write, attention): the 14 single-token passes of a frame and the first, two-token one
    (`frame_pass`); otherwise the layer applies the norms and rotary and this writes the
    cache and attends in torch."""
    if cuda:
        # Imported here: Triton is needed on CUDA machines only.
        from omniflow.kernels.frame_attention import frame_pass

        return fused_norm_rope(caches, functools.partial(frame_pass, start=start))

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = caches[layer]
        kc[:, start : start + length] = k
        vc[:, start : start + length] = v
        return dense_causal_attention(q, kc, vc, start)

    return attend
