"""The official `qwen-tts` side of the reference comparison (needs the package installed).

Install beside omniflow (the versions the fixtures were made with; docs/reference.md):

    python3 -m pip install --no-deps qwen-tts==0.1.1 transformers==4.57.3 \\
        tokenizers==0.22.2 huggingface_hub==0.36.2
    python3 -m pip install librosa einops

`--no-deps` because its full install pulls gradio, and a torchaudio that cannot load beside
the CPU torch; `install_shim` stubs the three modules only its 25 Hz tokenizer imports
(torchaudio, sox, onnxruntime), which nothing here runs. The configs are written from
omniflow's presets in the published spelling by code of their own (not omniflow's loader),
so a mapping error on either side shows up as a refused or mis-shaped load.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

import torch

from omniflow.models.qwen3_tts.tokenizer import ByteTokenizer
from omniflow.models.shapes import ModelConfig
from tests.reference.cases import (
    CASES,
    CLONE_CASES,
    CODEC_FRAMES,
    DECODE_FRAMES,
    ENCODER_SAMPLES,
    GREEDY_CASES,
    GREEDY_MAX_NEW_TOKENS,
    LOGIT_CASES,
    PREDICTOR_ROWS,
    PROMPT_CASES,
    SPEAKER_SAMPLES,
    CloneCase,
    PromptCase,
    clone_inputs,
    make_audio,
    random_codes,
    random_hidden,
)
from tests.reference.official_configs import (  # noqa: F401 - official_design reads them here
    PUBLISHED_DIALECTS,
    PUBLISHED_LANGUAGES,
    PUBLISHED_SPEAKERS,
    codec_config,
    speaker_encoder_config,
    tts_config,
)
from tests.reference.weights import draw

STUBBED = (
    "torchaudio",
    "torchaudio.compliance",
    "torchaudio.compliance.kaldi",
    "sox",
    "onnxruntime",
)


def install_shim() -> None:
    """Empty stand-ins for the modules the 25 Hz tokenizer imports (never run here)."""
    for name in STUBBED:
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = module


def versions() -> dict[str, str]:
    import importlib.metadata as md

    names = (
        "qwen-tts",
        "transformers",
        "tokenizers",
        "huggingface_hub",
        "torch",
        "numpy",
        "librosa",
    )
    return {p: md.version(p) for p in names}


@torch.no_grad()
def redraw(module: torch.nn.Module, seed: int) -> dict[str, tuple[int, ...]]:
    """Overwrite every floating-point tensor of `module` (parameters and persistent buffers)
    with `weights.draw`; returns name -> shape as the state dict (and so the checkpoint)
    names them."""
    shapes = {}
    for name, tensor in module.state_dict().items():
        if tensor.is_floating_point():
            tensor.copy_(draw(name, tuple(tensor.shape), seed))
        shapes[name] = tuple(tensor.shape)
    return shapes


def build(model: ModelConfig, seed: int):
    """The official TTS model and speech tokenizer for the preset, with drawn weights."""
    install_shim()
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    tts = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**tts_config(model))).eval()
    codec = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**codec_config(model))).eval()
    redraw(tts, seed)
    redraw(codec, seed)
    return tts, codec


def save(tts, codec, directory: Path) -> None:
    """The published layout, written by the official classes."""
    tts.save_pretrained(directory)
    codec.save_pretrained(directory / "speech_tokenizer")


class _Captured(Exception):
    pass


def _ids(case: PromptCase) -> tuple[torch.Tensor, torch.Tensor | None]:
    tok = ByteTokenizer()
    ids = torch.tensor([tok.encode_chat(case.text)])
    instruct = torch.tensor([tok.encode_instruct(case.instruct)]) if case.instruct else None
    return ids, instruct


def _generate_kwargs(case: PromptCase) -> dict:
    ids, instruct = _ids(case)
    return {
        "input_ids": [ids],
        "instruct_ids": [instruct],
        "languages": [case.language],
        "speakers": [case.speaker],
        "non_streaming_mode": case.non_streaming,
    }


def _talker_inputs(tts, **generate_kwargs) -> dict[str, Any]:
    """What the official `generate` hands its talker's generation loop (captured there, the
    loop never runs)."""
    box: dict[str, Any] = {}

    def capture(**kwargs):
        box.update(kwargs)
        raise _Captured

    tts.talker.generate = capture
    try:
        tts.generate(**generate_kwargs, max_new_tokens=4)
    except _Captured:
        pass
    finally:
        del tts.talker.generate
    return box


@torch.no_grad()
def prompt(tts, case: PromptCase) -> dict[str, torch.Tensor]:
    """The official prompt embeddings, trailing text embeddings and tts_pad embedding, as
    `generate` hands them to the talker's generation loop (captured there)."""
    box = _talker_inputs(tts, **_generate_kwargs(case))
    return {
        "embeds": box["inputs_embeds"][0].clone(),
        "trailing": box["trailing_text_hidden"][0].clone(),
        "tts_pad": box["tts_pad_embed"][0, 0].clone(),
    }


@torch.no_grad()
def decode_embeds(tts, frames: torch.Tensor, trailing: torch.Tensor, pad: torch.Tensor):
    """Decode-position inputs as the talker's forward builds them: the 16 codebook
    embeddings of the previous frame, summed, plus the step's trailing text embedding."""
    t = tts.talker
    rows = []
    for k, frame in enumerate(frames):
        parts = [t.get_input_embeddings()(frame[:1])]
        tables = t.code_predictor.get_input_embeddings()
        parts += [tables[g - 1](frame[g : g + 1]) for g in range(1, frame.shape[0])]
        row = torch.cat(parts, dim=0).sum(0)
        rows.append(row + (trailing[k] if k < trailing.shape[0] else pad))
    return torch.stack(rows)


@torch.no_grad()
def talker_logits(tts, embeds: torch.Tensor) -> torch.Tensor:
    """Codebook-0 logits at every position of one sequence of input embeddings."""
    x = embeds[None]
    mask = torch.ones(1, x.shape[1], dtype=torch.long)
    return tts.talker(inputs_embeds=x, attention_mask=mask, use_cache=False).logits[0]


@torch.no_grad()
def teacher_forced(tts, case_prompt: dict, frames: torch.Tensor) -> dict[str, torch.Tensor]:
    """Prompt + DECODE_FRAMES decode positions (teacher-forced frames): embeddings, logits."""
    dec = decode_embeds(
        tts, frames[:DECODE_FRAMES], case_prompt["trailing"], case_prompt["tts_pad"]
    )
    embeds = torch.cat([case_prompt["embeds"], dec])
    return {"embeds": embeds, "logits": talker_logits(tts, embeds)}


@torch.no_grad()
def predictor_logits(tts, hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """[B, 15, codebook] logits of codebooks 1..15, teacher-forced with `codes` [B, 16]."""
    t = tts.talker
    parts = [hidden[:, None], t.get_input_embeddings()(codes[:, :1])]
    tables = t.code_predictor.get_input_embeddings()
    parts += [tables[g - 1](codes[:, g : g + 1]) for g in range(1, codes.shape[1] - 1)]
    out = t.code_predictor.forward_finetune(inputs_embeds=torch.cat(parts, dim=1))
    return out.logits


@torch.no_grad()
def codec_pcm(codec, codes: torch.Tensor) -> torch.Tensor:
    """PCM of codes [T, 16] through the official decode (chunked_decode: exact below 300
    frames)."""
    return codec.decode(codes[None]).audio_values[0]


@torch.no_grad()
def encoder_codes(codec, audio: torch.Tensor) -> torch.Tensor:
    """Codes [frames, 16] of 24 kHz audio [N] by the official speech tokenizer's encode."""
    mask = torch.ones(1, audio.shape[0], dtype=torch.long)
    return codec.encode(audio[None], padding_mask=mask).audio_codes[0]


@torch.no_grad()
def speaker(tts, audio: torch.Tensor) -> dict[str, torch.Tensor]:
    """The official mel features and speaker embedding of 24 kHz audio [N]."""
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    mel = mel_spectrogram(
        audio[None],
        n_fft=1024,
        num_mels=128,
        sampling_rate=24000,
        hop_size=256,
        win_size=1024,
        fmin=0,
        fmax=12000,
    ).transpose(1, 2)
    embedding = tts.extract_speaker_embedding(audio.numpy(), 24000)
    return {"mel": mel[0], "embedding": embedding}


@torch.no_grad()
def greedy(tts, case: PromptCase, max_new_tokens: int) -> torch.Tensor:
    """Frames [n, 16] of a greedy generation (codebook 0 and the code predictor argmax)."""
    codes, _ = tts.generate(
        **_generate_kwargs(case),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        subtalker_dosample=False,
    )
    return codes[0]


@torch.no_grad()
def clone_prompt(tts, case: CloneCase, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The official Base-model prompt embeddings and trailing text embeddings for a voice-clone
    prompt (what `generate_voice_clone` hands `generate`: the speaker embedding, and in
    context the reference codes and the tokenized reference turn, `_build_ref_text`'s
    `<|im_start|>assistant\\n{ref_text}<|im_end|>\\n`)."""
    tok = ByteTokenizer()
    icl = case.ref_text is not None
    ref_ids = [torch.tensor([tok.encode_chat(case.ref_text)[:-3]])] if icl else [None]
    voice_clone_prompt = {
        "ref_code": [inputs["ref_codes"]] if icl else [None],
        "ref_spk_embedding": [inputs["speaker"]],
        "x_vector_only_mode": [not icl],
        "icl_mode": [icl],
    }
    box = _talker_inputs(
        tts,
        input_ids=[torch.tensor([tok.encode_chat(case.text)])],
        ref_ids=ref_ids,
        voice_clone_prompt=voice_clone_prompt,
        languages=[case.language],
        non_streaming_mode=case.non_streaming,
    )
    return {
        "embeds": box["inputs_embeds"][0].clone(),
        "trailing": box["trailing_text_hidden"][0].clone(),
    }


def outputs(tts, codec, model) -> dict[str, torch.Tensor]:
    """Every compared quantity; add new comparisons here (and their inputs in cases.py)."""
    out: dict[str, torch.Tensor] = {}
    for case in PROMPT_CASES:
        for key, value in prompt(tts, case).items():
            out[f"prompt/{case.name}/{key}"] = value
    for case in CLONE_CASES:
        inputs = clone_inputs(case, model.talker.hidden_size, model.codec.codebook_size)
        for key, value in {**inputs, **clone_prompt(tts, case, inputs)}.items():
            out[f"clone/{case.name}/{key}"] = value
    for name in LOGIT_CASES:
        frames = random_codes(f"decode/{name}", (DECODE_FRAMES, 16), model.codec.codebook_size)
        forced = teacher_forced(tts, prompt(tts, CASES[name]), frames)
        out[f"logits/{name}/frames"] = frames
        out[f"logits/{name}/embeds"] = forced["embeds"]
        out[f"logits/{name}/logits"] = forced["logits"]
    groups = model.code_predictor.num_code_groups
    hidden = random_hidden("predictor", (PREDICTOR_ROWS, model.talker.hidden_size))
    codes = random_codes("predictor", (PREDICTOR_ROWS, groups), model.code_predictor.codebook_size)
    out["predictor/hidden"] = hidden
    out["predictor/codes"] = codes
    out["predictor/logits"] = predictor_logits(tts, hidden, codes)
    frames = random_codes("codec", (CODEC_FRAMES, groups), model.codec.codebook_size)
    out["codec/codes"] = frames
    out["codec/pcm"] = codec_pcm(codec, frames)
    for name in GREEDY_CASES:
        out[f"greedy/{name}/codes"] = greedy(tts, CASES[name], GREEDY_MAX_NEW_TOKENS)
    audio = make_audio("encoder", ENCODER_SAMPLES)
    out["encoder/audio"] = audio
    out["encoder/codes"] = encoder_codes(codec, audio)
    audio = make_audio("speaker", SPEAKER_SAMPLES)
    out["speaker/audio"] = audio
    for key, value in speaker(tts, audio).items():
        out[f"speaker/{key}"] = value
    return {k: v.detach().contiguous() for k, v in out.items()}
