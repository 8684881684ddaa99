"""The talker as the engine drives it: input embeddings, paged forward, codebook-0 logits,
and the frame completion by the code predictor.

Inputs per position are (text id, up to 16 codec ids): prompt positions carry one codec id
(or none), decode positions the previous frame's 16 codes. One embedding path serves
prefill, decode and recompute after preemption.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from omniflow.models.layers.attention import AttentionMetadata, write_kv
from omniflow.models.layers.linear import run_linear
from omniflow.models.layers.qwen3 import KVCaches, fuse_projections, run_layers_norm
from omniflow.models.layers.rotary import Rotary
from omniflow.models.qwen3_tts.code_predictor import CodePredictor, SampleFn
from omniflow.models.qwen3_tts.modules import Qwen3TTSTalkerWeights
from omniflow.models.qwen3_tts.vocab import CodecVocab
from omniflow.models.shapes import ModelConfig

ROWS_MIN = 16
ROWS_MET = 2048
"""On CUDA the talker's eager GEMMs over a varying row count (a prompt's text projection,
before its graph; codebook 0's logits of a step's rows) run at a power of two from 16. A
GEMM over a row count cuBLAS has not met makes it choose a kernel on the host, and load one
it has not used yet: time on an admitting step's path to first audio (measured:
docs/performance.md). A few shapes then serve every step of up to 2048 rows, each met once
at build."""


def padded_rows(n: int) -> int:
    """The row count a GEMM over `n` rows runs at on CUDA: above `ROWS_MET`, `n` itself (a
    larger shape would be new anyway, and twice the work)."""
    if n > ROWS_MET:
        return n
    return max(ROWS_MIN, 1 << (n - 1).bit_length())


@dataclass(frozen=True)
class TalkerInputs:
    """Flattened per-position inputs of one step."""

    text_ids: torch.Tensor
    """[T] text id per position."""
    codes: torch.Tensor
    """[T, 16] codec ids; entries where `code_mask` is False are ignored."""
    code_mask: torch.Tensor
    """[T, 16] which codec ids contribute (prompt: at most column 0; decode: all 16)."""
    later_codes: bool | None = None
    """Whether any position has codes past column 0, when the host knows it (None: read
    from `code_mask` on the device, a sync)."""


class Talker:
    """Engine-facing talker over `Qwen3TTSTalkerWeights`."""

    def __init__(self, weights: Qwen3TTSTalkerWeights, config: ModelConfig, vocab: CodecVocab):
        self.weights = weights
        self.config = config
        self.vocab = vocab
        self.shape = config.talker
        t = weights.talker
        self.num_groups = config.code_predictor.num_code_groups
        self.rotary = Rotary(self.shape.head_dim, self.shape.rope_theta)
        self.predictor = CodePredictor(t.code_predictor, config.code_predictor)
        self.pad_rows = t.codec_head.weight.is_cuda
        """Whether the text projection and codebook 0's logits run at `padded_rows` (CUDA);
        the CPU computes the rows as they are, bit for bit the reference's."""
        if t.codec_head.weight.is_cuda:
            # On CUDA pack q/k/v and gate/up (one GEMM each): launch-bound at decode sizes.
            # The CPU keeps the separate projections, bit for bit the reference's.
            fuse_projections(t)
            self._meet_rows()

    @property
    def num_layers(self) -> int:
        return self.shape.num_layers

    @torch.no_grad()
    def _meet_rows(self) -> None:
        """Every padded row count up to `ROWS_MET` through both GEMMs once, at build."""
        ids = torch.zeros(
            ROWS_MET, dtype=torch.int64, device=self.weights.talker.codec_head.weight.device
        )
        rows = ROWS_MIN
        while rows <= ROWS_MET:
            self.logits(self.project_text(ids[:rows]))
            rows *= 2

    def _at_padded_rows(self, x: Tensor, gemm: Callable[[Tensor], Tensor], least: int) -> Tensor:
        """`gemm(x)` over `x`'s rows padded to `padded_rows` (on CUDA, from `least` rows),
        the padding's rows cut off again."""
        n = x.shape[0]
        rows = padded_rows(n) if self.pad_rows and n >= least else n
        if rows != n:  # F.pad lists the last dimension first: only the first one grows
            x = F.pad(x, (0, 0) * (x.dim() - 1) + (0, rows - n))
        return gemm(x)[:n]

    @torch.no_grad()
    def project_text(self, text_ids: Tensor) -> Tensor:
        """The projected text embedding of `text_ids` [T] (at `padded_rows` on CUDA)."""
        t = self.weights.talker
        return self._at_padded_rows(
            text_ids, lambda ids: t.text_projection(t.model.text_embedding(ids)), least=0
        )

    @torch.no_grad()
    def embed(self, inputs: TalkerInputs) -> torch.Tensor:
        """Projected text embedding + summed codec embeddings, per position."""
        t = self.weights.talker
        x = self.project_text(inputs.text_ids)
        mask = inputs.code_mask
        codes = inputs.codes.masked_fill(~mask, 0)
        x = x + t.model.codec_embedding(codes[:, 0]) * mask[:, :1].to(x.dtype)
        later = inputs.later_codes
        if later is None:
            later = bool(mask[:, 1:].any())
        if later:
            tables = t.code_predictor.model.codec_embedding
            for g in range(1, self.num_groups):
                x = x + tables[g - 1](codes[:, g]) * mask[:, g : g + 1].to(x.dtype)
        return x

    @torch.no_grad()
    def forward(
        self, embeds: Tensor, positions: Tensor, meta: AttentionMetadata, kv_caches: KVCaches
    ) -> Tensor:
        """Run the decoder over the flattened batch; returns final-norm hidden states [T, H].
        The metadata's type picks the attention (mixed steps, or one token per request)."""
        # A context of n tokens holds positions < n: the bound comes from the host's lengths.
        cos, sin = self.rotary.cos_sin(positions, embeds.dtype, bound=max(meta.seq_lens, default=1))

        def attend(layer: int, q, k, v):
            kc, vc = kv_caches[layer]
            write_kv(kc, vc, k, v, meta.slot_mapping)
            return meta.attend(q, kc, vc)

        t = self.weights.talker
        return run_layers_norm(t.model.layers, t.model.norm, embeds, cos, sin, attend)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Codebook 0's logits [B, vocab] (at `padded_rows` on CUDA from two rows; one row
        takes the skinny GEMM, `run_linear`)."""
        head = self.weights.talker.codec_head
        return self._at_padded_rows(hidden, lambda h: run_linear(head, h), least=2)

    @torch.no_grad()
    def complete_frames(
        self, hidden: torch.Tensor, code0: torch.Tensor, sample: SampleFn
    ) -> torch.Tensor:
        """[B, 16] frames: code0 plus the code predictor's 15 codes (EOS rows are garbage
        and must be ignored by the caller)."""
        safe = code0.clamp(max=self.shape.vocab_size - 1)
        emb0 = self.weights.talker.model.codec_embedding(safe)
        rest = self.predictor.predict(hidden, emb0, sample)
        return torch.cat([code0[:, None], rest], dim=1)
