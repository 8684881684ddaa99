"""The Base models' speaker encoder: log-mel frames -> one speaker embedding (ECAPA-TDNN).

Module names follow the published checkpoint (`speaker_encoder.*` in model.safetensors), so
`SpeakerEncoderWeights` loads name for name. The structure: a TDNN layer, SE-Res2Net
blocks (1x1 TDNN, a Res2Net of dilated TDNNs over channel groups, 1x1 TDNN, squeeze-and-
excitation, residual), a TDNN over the blocks' concatenated outputs, attentive statistics
pooling (mean and standard deviation under a learned attention over time), and a 1x1
convolution to the embedding, whose width is the talker's hidden size: the embedding takes
the place of a preset speaker's codec embedding in the prompt. Every convolution pads
"same" by reflection. Features come from `mel.LogMel`.

Not wired into serving yet: the Base prompt layouts will use it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn

from omniflow.models.qwen3_tts.loader import CheckpointError, load_state, read_config, weight_files
from omniflow.models.qwen3_tts.mel import LogMel, MelShape


@dataclass(frozen=True)
class SpeakerEncoderShape:
    """`speaker_encoder_config` of a Base checkpoint (defaults: the official class's)."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    def __post_init__(self) -> None:
        c = self.enc_channels
        if not len(c) == len(self.enc_kernel_sizes) == len(self.enc_dilations) >= 3:
            raise ValueError(
                "enc_channels, enc_kernel_sizes and enc_dilations need one entry per layer"
            )
        if c[-1] != sum(c[1:-1]):
            raise ValueError("enc_channels[-1] must be the sum of the SE-Res2Net blocks' widths")

    @classmethod
    def toy(cls, enc_dim: int) -> SpeakerEncoderShape:
        """The tiny preset's speaker encoder (dummy weights; the reference fixtures use it):
        toy channels, an embedding as wide as the talker (`enc_dim`)."""
        return cls(
            enc_dim=enc_dim,
            enc_channels=(16, 16, 16, 16, 48),
            enc_attention_channels=8,
            enc_se_channels=8,
        )

    @classmethod
    def from_config(cls, cfg: dict) -> SpeakerEncoderShape:
        """The shape a checkpoint's `speaker_encoder_config` states (absent keys: defaults)."""
        known = {f.name for f in fields(cls)}
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k in known}
        return cls(**kw)

    def config(self) -> dict:
        """`speaker_encoder_config` in the published spelling."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def _conv(c_in: int, c_out: int, k: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, k, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    """Convolution + ReLU."""

    def __init__(self, c_in: int, c_out: int, k: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = _conv(c_in, c_out, k, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Res2Net(nn.Module):
    """Channel groups: the first passes through, each next one is a TDNN of itself plus the
    previous group's output."""

    def __init__(self, channels: int, scale: int, k: int, dilation: int) -> None:
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(width, width, k, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        out = [parts[0]]
        prev = None
        for block, part in zip(self.blocks, parts[1:], strict=True):
            prev = block(part if prev is None else part + prev)
            out.append(prev)
        return torch.cat(out, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, squeeze)
        self.conv2 = _conv(squeeze, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, s: SpeakerEncoderShape, k: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNN(c_in, c_out, 1)
        self.res2net_block = Res2Net(c_out, s.enc_res2net_scale, k, dilation)
        self.tdnn2 = TDNN(c_out, c_out, 1)
        self.se_block = SqueezeExcitation(c_out, s.enc_se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatsPool(nn.Module):
    """Mean and standard deviation over time, weighted by an attention that itself sees the
    utterance's global mean and standard deviation."""

    EPS = 1e-12

    def __init__(self, channels: int, attention: int) -> None:
        super().__init__()
        self.tdnn = TDNN(3 * channels, attention, 1)
        self.conv = _conv(attention, channels)

    @classmethod
    def _stats(cls, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (w * x).sum(dim=2)
        var = (w * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2)
        return mean, torch.sqrt(var.clamp(min=cls.EPS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[2]
        uniform = torch.full((1, 1, frames), 1.0 / frames, dtype=x.dtype, device=x.device)
        mean, std = self._stats(x, uniform)
        context = torch.cat(
            [x, mean.unsqueeze(2).expand(-1, -1, frames), std.unsqueeze(2).expand(-1, -1, frames)],
            dim=1,
        )
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, attention)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """mel [B, frames, mel_dim] -> embedding [B, enc_dim]."""

    def __init__(self, shape: SpeakerEncoderShape) -> None:
        super().__init__()
        self.shape = shape
        c, k, d = shape.enc_channels, shape.enc_kernel_sizes, shape.enc_dilations
        blocks: list[nn.Module] = [TDNN(shape.mel_dim, c[0], k[0], d[0])]
        blocks += [SERes2NetBlock(c[i - 1], c[i], shape, k[i], d[i]) for i in range(1, len(c) - 1)]
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNN(c[-1], c[-1], k[-1], d[-1])
        self.asp = AttentiveStatsPool(c[-1], shape.enc_attention_channels)
        self.fc = _conv(2 * c[-1], shape.enc_dim)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = mel.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)


class SpeakerEncoderWeights(nn.Module):
    """Root so that parameter names start with `speaker_encoder.` as in model.safetensors;
    `embed` runs the mel front end and the encoder."""

    def __init__(self, shape: SpeakerEncoderShape, mel: MelShape | None = None) -> None:
        super().__init__()
        mel = mel or MelShape()
        if mel.n_mels != shape.mel_dim or mel.sample_rate != shape.sample_rate:
            raise ValueError("the mel front end must give mel_dim bins at the encoder's rate")
        self.mel = LogMel(mel)
        self.speaker_encoder = SpeakerEncoder(shape)

    @torch.no_grad()
    def embed(self, audio: torch.Tensor) -> torch.Tensor:
        """audio [B, N] at `sample_rate` -> [B, enc_dim]."""
        return self.speaker_encoder(self.mel(audio))


def check_speaker_encoder_config(shape: SpeakerEncoderShape, cfg: dict) -> None:
    """Refuse a config.json whose speaker_encoder_config differs from `shape`."""
    theirs = SpeakerEncoderShape.from_config(cfg.get("speaker_encoder_config", {}))
    for f in fields(shape):
        if getattr(theirs, f.name) != getattr(shape, f.name):
            raise CheckpointError(
                f"speaker encoder {f.name} is {getattr(shape, f.name)!r} but the checkpoint's "
                f"config.json has speaker_encoder_config.{f.name} = {getattr(theirs, f.name)!r}"
            )


def load_speaker_encoder(
    shape: SpeakerEncoderShape, model_dir: Path | None, seed: int
) -> SpeakerEncoderWeights:
    """From a Base checkpoint (`speaker_encoder.*`, strict), or seeded dummy weights."""
    weights = SpeakerEncoderWeights(shape)
    if model_dir is None:
        init_dummy_speaker_encoder(weights, seed)
        return weights.eval()
    check_speaker_encoder_config(shape, read_config(model_dir))
    load_state(weights, weight_files(model_dir), "speaker_encoder.")
    return weights.eval()


@torch.no_grad()
def init_dummy_speaker_encoder(module: nn.Module, seed: int) -> None:
    """Deterministic dummy weights scaled by fan-in (an embedding of noise, not a voice)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith(".bias"):
            p.zero_()
        else:
            fan_in = p[0].numel()
            p.copy_(torch.empty(p.shape).normal_(0.0, 1.0 / fan_in**0.5, generator=gen))
