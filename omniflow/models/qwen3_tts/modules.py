"""Qwen3-TTS talker and code predictor as torch modules named like the published checkpoint.

`Qwen3TTSTalkerWeights().state_dict()` has exactly the checkpoint's `talker.*` keys, so
loading is a name-for-name copy with shape checks. The forward logic that needs engine
context (paged attention, sampling) lives in talker.py and code_predictor.py.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from omniflow.models.layers.norm import RMSNorm
from omniflow.models.layers.qwen3 import Qwen3DecoderLayer
from omniflow.models.shapes import CodePredictorShape, TalkerShape


class ResizeMLP(nn.Module):
    """text_projection: Linear + SiLU + Linear, with biases."""

    def __init__(self, d_in: int, d_mid: int, d_out: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(d_in, d_mid, bias=True)
        self.linear_fc2 = nn.Linear(d_mid, d_out, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerBackbone(nn.Module):
    """talker.model: embeddings, decoder layers, final norm."""

    def __init__(self, shape: TalkerShape) -> None:
        super().__init__()
        self.codec_embedding = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.text_embedding = nn.Embedding(shape.text_vocab_size, shape.text_hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(shape, i) for i in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)


class CodePredictorBackbone(nn.Module):
    """talker.code_predictor.model: 15 codebook embeddings (talker width), layers, norm."""

    def __init__(self, shape: CodePredictorShape, talker_hidden: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Qwen3DecoderLayer(shape, i) for i in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(shape.codebook_size, talker_hidden)
            for _ in range(shape.num_code_groups - 1)
        )


class CodePredictorModule(nn.Module):
    """talker.code_predictor: backbone, one head per codebook 1..15, input projection."""

    def __init__(self, shape: CodePredictorShape, talker_hidden: int) -> None:
        super().__init__()
        self.model = CodePredictorBackbone(shape, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(shape.hidden_size, shape.codebook_size, bias=False)
            for _ in range(shape.num_code_groups - 1)
        )
        # The published 0.6B has equal widths and no projection; 1.7B projects 2048 -> 1024.
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(talker_hidden, shape.hidden_size, bias=True)
            if talker_hidden != shape.hidden_size
            else nn.Identity()
        )


class TalkerModule(nn.Module):
    """talker: backbone, text projection, codebook-0 head, code predictor."""

    def __init__(self, talker: TalkerShape, predictor: CodePredictorShape) -> None:
        super().__init__()
        self.model = TalkerBackbone(talker)
        self.text_projection = ResizeMLP(
            talker.text_hidden_size, talker.text_hidden_size, talker.hidden_size
        )
        self.codec_head = nn.Linear(talker.hidden_size, talker.vocab_size, bias=False)
        self.code_predictor = CodePredictorModule(predictor, talker.hidden_size)


class Qwen3TTSTalkerWeights(nn.Module):
    """Root so that parameter names start with `talker.` as in model.safetensors."""

    def __init__(self, talker: TalkerShape, predictor: CodePredictorShape) -> None:
        super().__init__()
        self.talker_shape = talker
        self.predictor_shape = predictor
        """The shapes built from: what `loader.save_talker` writes into config.json."""
        self.talker = TalkerModule(talker, predictor)


@torch.no_grad()
def init_dummy(module: nn.Module, seed: int, std: float = 0.02) -> None:
    """Deterministic dummy weights: every tensor drawn, in name order, from one generator.

    Norm weights are ones and biases zeros, as a freshly initialised model has. Dummy
    weights produce noise, not speech; they exist so that everything runs without a checkpoint.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, param in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            values = torch.empty(param.shape, dtype=torch.float32)
            values.normal_(0.0, std, generator=gen)
            param.copy_(values)
