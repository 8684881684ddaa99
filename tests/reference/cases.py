"""What the reference comparison feeds both implementations, and where its fixtures live.

One list of cases, read by the fixture script (scripts/make_reference_fixtures.py, which
runs the official `qwen-tts`) and by the tests (which run omniflow). To compare something
new, add its inputs here, its official side to `official.py` (and `official.outputs`), its
omniflow side to `ours.py` (and `ours.measure`), a test, and rerun the script.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures"
SEED = 1234
"""Seed of the weights (weights.py) and of every random input below."""


@dataclass(frozen=True)
class PromptCase:
    """A CustomVoice request, laid out by both implementations."""

    name: str
    text: str
    speaker: str | None
    language: str
    instruct: str | None = None
    non_streaming: bool = True


PROMPT_CASES = (
    PromptCase("en_vivian_stream", "Hello there.", "vivian", "english", non_streaming=False),
    PromptCase("en_vivian_whole", "Hello there.", "vivian", "english"),
    PromptCase("auto_ryan_style_whole", "Good morning!", "ryan", "auto", "Speak slowly."),
    PromptCase("auto_ryan_style_stream", "Good morning!", "ryan", "auto", "Speak slowly.", False),
    PromptCase("zh_dylan_whole", "你好，北京。", "dylan", "chinese"),
    PromptCase("auto_eric_stream", "Hi.", "eric", "auto", non_streaming=False),
    PromptCase("en_eric_whole", "Hi.", "eric", "english"),
    PromptCase("pt_serena_whole", "Olá!", "serena", "portuguese"),
    PromptCase("de_sohee_stream", "Guten Tag.", "sohee", "german", non_streaming=False),
)
CASES = {c.name: c for c in PROMPT_CASES}


@dataclass(frozen=True)
class CloneCase:
    """A Base-model (voice clone) request: a seeded random speaker embedding, and for
    in-context cloning `ref_frames` seeded random reference frames with `ref_text`."""

    name: str
    text: str
    language: str
    ref_text: str | None = None
    ref_frames: int = 0
    non_streaming: bool = False


CLONE_CASES = (
    # streaming text, the ICL text (ref + text + eos) longer than bos + frames: trailing text
    CloneCase("icl_en_stream_long", "Hello there, friend.", "english", "Hi.", 4),
    # streaming text shorter than the reference: text padded with tts_pad, no trailing text
    CloneCase("icl_auto_stream_short", "Yes.", "auto", "Okay", 9),
    CloneCase("icl_zh_whole", "你好。", "chinese", "早上好", 5, non_streaming=True),
    CloneCase("xvec_en_stream", "Hello there.", "english"),
    CloneCase("xvec_auto_whole", "Good morning!", "auto", non_streaming=True),
)


DESIGN_PRESET = "qwen3_tts_tiny_voicedesign"
"""The VoiceDesign fixture's preset: the tiny shapes, saved by the official classes as a
VoiceDesign model (tts_model_type voice_design, no speakers)."""
DESIGN_CASES = (
    # the official generate_voice_design's defaults: whole text, language Auto
    PromptCase("vd_auto_whole", "Hello there.", None, "auto", "A warm, low female voice."),
    PromptCase("vd_en_stream", "Good morning!", None, "english", "A cheerful young man.", False),
    PromptCase("vd_zh_whole", "你好，北京。", None, "chinese", "稚嫩的女声，音调偏高。"),
    PromptCase("vd_de_stream", "Guten Tag.", None, "german", "Calm, slow, deep.", False),
)
"""VoiceDesign requests: a description (the instruction turn) and no speaker."""
DESIGN_LOGIT_CASES = ("vd_auto_whole", "vd_en_stream")
DESIGN_GREEDY_CASES = ("vd_auto_whole", "vd_en_stream")


def clone_inputs(case: CloneCase, hidden: int, codebook: int) -> dict[str, torch.Tensor]:
    """The case's speaker embedding [hidden] and reference codes [ref_frames, 16]."""
    out = {"speaker": random_hidden(f"clone/{case.name}", (hidden,))}
    if case.ref_text is not None:
        out["ref_codes"] = random_codes(f"clone/{case.name}", (case.ref_frames, 16), codebook)
    return out


LOGIT_CASES = ("en_vivian_stream", "en_vivian_whole")
"""Talker logits over the prompt and DECODE_FRAMES teacher-forced decode positions."""
DECODE_FRAMES = 6
GREEDY_CASES = ("en_vivian_stream", "en_vivian_whole", "zh_dylan_whole")
"""Whole greedy generations (codebook 0 and the code predictor argmax) to a length stop."""
GREEDY_MAX_NEW_TOKENS = 10
PREDICTOR_ROWS = 3
CODEC_FRAMES = 12
ENCODER_SAMPLES = 31_111
"""Codec encoder input (1.3 s; not a whole number of frames, so the last one is padded)."""
SPEAKER_SAMPLES = 19_200
"""Speaker encoder input (0.8 s)."""


def random_codes(tag: str, shape: tuple[int, ...], high: int) -> torch.Tensor:
    """Fixed integer inputs in [0, high), seeded by `tag`."""
    rng = np.random.RandomState((SEED * 7919 + sum(map(ord, tag)) * 31) % 2**32)
    return torch.from_numpy(rng.randint(0, high, size=shape).astype(np.int64))


def make_audio(tag: str, samples: int) -> torch.Tensor:
    """A 24 kHz test signal: two chirping tones and some noise, within [-0.6, 0.6]."""
    rng = np.random.RandomState((SEED * 31 + sum(map(ord, tag))) % 2**32)
    t = np.arange(samples) / 24000.0
    tone = 0.3 * np.sin(2 * np.pi * (180 + 140 * t) * t) + 0.2 * np.sin(2 * np.pi * 1250 * t**1.5)
    return torch.from_numpy((tone + 0.1 * rng.standard_normal(samples)).astype(np.float32))


def random_hidden(tag: str, shape: tuple[int, ...]) -> torch.Tensor:
    rng = np.random.RandomState((SEED * 104729 + sum(map(ord, tag)) * 17) % 2**32)
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


@dataclass(frozen=True)
class Fixture:
    """One preset's committed fixture: the official config files, tensor names and shapes
    (the published layout as the official code saves it), and its outputs."""

    directory: Path
    meta: dict
    talker_config: dict
    codec_config: dict
    talker_shapes: dict[str, tuple[int, ...]]
    codec_shapes: dict[str, tuple[int, ...]]
    tensors: dict[str, torch.Tensor]

    @classmethod
    def load(cls, preset: str) -> Fixture:
        d = FIXTURES / preset
        keys = json.loads((d / "keys.json").read_text())
        return cls(
            directory=d,
            meta=json.loads((d / "meta.json").read_text()),
            talker_config=json.loads((d / "config.json").read_text()),
            codec_config=json.loads((d / "speech_tokenizer_config.json").read_text()),
            talker_shapes={k: tuple(v) for k, v in keys["talker"].items()},
            codec_shapes={k: tuple(v) for k, v in keys["codec"].items()},
            tensors=load_file(str(d / "outputs.safetensors")),
        )
