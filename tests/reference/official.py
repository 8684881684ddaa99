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
from tests.reference.weights import draw

STUBBED = (
    "torchaudio",
    "torchaudio.compliance",
    "torchaudio.compliance.kaldi",
    "sox",
    "onnxruntime",
)

# The published CustomVoice tables (talker_config of the 12 Hz checkpoints).
PUBLISHED_LANGUAGES = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
    "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}
PUBLISHED_SPEAKERS = {
    "serena": 3066,
    "vivian": 3065,
    "uncle_fu": 3010,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
    "eric": 2875,
    "dylan": 2878,
}
PUBLISHED_DIALECTS = {name: False for name in PUBLISHED_SPEAKERS} | {
    "eric": "sichuan_dialect",
    "dylan": "beijing_dialect",
}


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


def _transformer(s: Any) -> dict:
    return {
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.num_layers,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim,
        "rms_norm_eps": s.rms_norm_eps,
        "rope_theta": s.rope_theta,
        "hidden_act": "silu",
        "attention_bias": False,
        "max_position_embeddings": 32768,
    }


def tts_config(model: ModelConfig) -> dict:
    """Qwen3TTSConfig kwargs for `model`'s shapes (CustomVoice, byte-tokenizer specials)."""
    t, p = model.talker, model.code_predictor
    s = ByteTokenizer().specials
    half = t.head_dim // 2
    sections = [24, 20, 20] if half == 64 else [half - 2 * (half // 3), half // 3, half // 3]
    talker = {
        **_transformer(t),
        "vocab_size": t.vocab_size,
        "text_vocab_size": t.text_vocab_size,
        "text_hidden_size": t.text_hidden_size,
        "num_code_groups": p.num_code_groups,
        "rope_scaling": {"rope_type": "default", "mrope_section": sections, "interleaved": True},
        "codec_eos_token_id": 2150,
        "codec_think_id": 2154,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_language_id": dict(PUBLISHED_LANGUAGES),
        "spk_id": dict(PUBLISHED_SPEAKERS),
        "spk_is_dialect": dict(PUBLISHED_DIALECTS),
        "code_predictor_config": {
            **_transformer(p),
            "vocab_size": p.codebook_size,
            "num_code_groups": p.num_code_groups,
        },
    }
    return {
        "talker_config": talker,
        "speaker_encoder_config": speaker_encoder_config(model),
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        # a Base model has the speaker encoder (saved as speaker_encoder.*); the CustomVoice
        # paths compared here do not depend on the type
        "tts_model_type": "base",
        "tts_model_size": model.name,
        "im_start_token_id": s.im_start,
        "im_end_token_id": s.im_end,
        "tts_pad_token_id": s.tts_pad,
        "tts_bos_token_id": s.tts_bos,
        "tts_eos_token_id": s.tts_eos,
    }


def speaker_encoder_config(model: ModelConfig) -> dict:
    """The published speaker encoder with the talker's width (its embedding takes a codec
    embedding's place); at toy widths, toy channels."""
    hidden = model.talker.hidden_size
    if hidden >= 256:
        return {"enc_dim": hidden}
    return {
        "enc_dim": hidden,
        "enc_channels": [16, 16, 16, 16, 48],
        "enc_attention_channels": 8,
        "enc_se_channels": 8,
    }


def codec_config(model: ModelConfig) -> dict:
    """Qwen3TTSTokenizerV2Config kwargs for the preset's codec (decoder shapes; a Mimi
    encoder at the preset's width, not compared yet)."""
    c = model.codec
    small = c.hidden_size < 256
    encoder = (
        {
            "hidden_size": c.hidden_size,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": c.hidden_size // 2,
            "intermediate_size": 2 * c.hidden_size,
            "num_filters": 4,
            "upsample_groups": c.hidden_size,
            "codebook_dim": c.codebook_dim,
            "vector_quantization_hidden_dimension": c.codebook_dim,
            "codebook_size": c.codebook_size,
            "num_quantizers": 32,
            "frame_rate": 12.5,
        }
        if small
        else {"num_quantizers": 32, "frame_rate": 12.5}
    )
    return {
        "encoder_config": encoder,
        "decoder_config": {
            "codebook_size": c.codebook_size,
            "codebook_dim": 2 * c.codebook_dim,
            "hidden_size": c.hidden_size,
            "latent_dim": c.latent_dim,
            "rope_theta": c.rope_theta,
            "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads or c.num_heads,
            "head_dim": c.head_dim,
            "sliding_window": c.sliding_window,
            "intermediate_size": c.intermediate_size,
            "hidden_act": "silu",
            "rms_norm_eps": c.rms_norm_eps,
            "num_hidden_layers": c.num_layers,
            "num_quantizers": c.num_quantizers,
            "upsample_rates": list(c.upsample_rates),
            "upsampling_ratios": list(c.upsampling_ratios),
            "decoder_dim": c.decoder_dim,
        },
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": c.sample_rate,
        "output_sample_rate": c.sample_rate,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
    }


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
