"""The official VoiceDesign side of the reference comparison (needs `qwen-tts`; official.py
says how to install it).

The official model is built as a VoiceDesign model (`tts_model_type: voice_design`, the
published VoiceDesign tables: no speakers, no dialects) from the preset's shapes, with the
same drawn weights as official.py's. Its public entry point, `Qwen3TTSModel.
generate_voice_design`, runs with `ByteProcessor` standing in for the checkpoint's BPE
processor: so the official wrapper builds the chat and description strings, picks its
defaults (whole text, language Auto) and tokenizes, and what it hands `generate` is recorded
there. Those inputs then give the prompt embeddings (captured where `generate` hands them to
the talker), teacher-forced logits and a greedy generation, as for CustomVoice.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from omniflow.models.qwen3_tts.tokenizer import ByteTokenizer
from omniflow.models.shapes import ModelConfig
from tests.reference import official
from tests.reference.cases import (
    DECODE_FRAMES,
    DESIGN_CASES,
    DESIGN_GREEDY_CASES,
    DESIGN_LOGIT_CASES,
    GREEDY_MAX_NEW_TOKENS,
    PromptCase,
    random_codes,
)

INPUT_KEYS = ("input_ids", "instruct_ids", "languages", "speakers", "non_streaming_mode")
"""What `generate_voice_design` hands `generate` that lays out the prompt."""
_SPECIAL = re.compile(r"(<\|im_start\|>|<\|im_end\|>)")


class ByteProcessor:
    """The byte tokenizer as the official processor is called (`processor(text=...)`): the
    chat markers as their special ids, `assistant` after `<|im_start|>` as its id, any other
    text as UTF-8 bytes. It tokenizes the strings the official wrapper writes, independently
    of omniflow's `encode_chat` / `encode_instruct`, whose ids the test compares with these."""

    def __call__(self, text: str, return_tensors: str = "pt", padding: bool = True) -> dict:
        s = ByteTokenizer().specials
        ids: list[int] = []
        after_start = False
        for part in _SPECIAL.split(text):
            if part == "<|im_start|>":
                ids.append(s.im_start)
                after_start = True
                continue
            if part == "<|im_end|>":
                ids.append(s.im_end)
            elif after_start and part.startswith("assistant"):
                ids += [s.assistant, *part[len("assistant") :].encode()]
            else:
                ids += list(part.encode())
            after_start = False
        return {"input_ids": torch.tensor([ids])}


def design_config(model: ModelConfig) -> dict:
    """official.tts_config's model as the published VoiceDesign one: its type, no speakers,
    the languages without the dialects, no speaker encoder."""
    cfg = official.tts_config(model)
    talker = dict(cfg["talker_config"])
    talker["codec_language_id"] = {
        k: v for k, v in talker["codec_language_id"].items() if "dialect" not in k
    }
    talker["spk_id"] = {}
    talker["spk_is_dialect"] = {}
    cfg = {k: v for k, v in cfg.items() if k != "speaker_encoder_config"}
    return {**cfg, "talker_config": talker, "tts_model_type": "voice_design"}


def build(model: ModelConfig, seed: int):
    """The official VoiceDesign model and speech tokenizer, with drawn weights."""
    official.install_shim()
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    config = Qwen3TTSConfig(**design_config(model))
    tts = Qwen3TTSForConditionalGeneration(config).eval()
    assert tts.speaker_encoder is None and tts.tts_model_type == "voice_design"
    codec_config = Qwen3TTSTokenizerV2Config(**official.codec_config(model))
    codec = Qwen3TTSTokenizerV2Model(codec_config).eval()
    official.redraw(tts, seed)
    official.redraw(codec, seed)
    return tts, codec


class _Recorded(Exception):
    pass


@torch.no_grad()
def wrapper_inputs(tts, case: PromptCase) -> dict[str, Any]:
    """What the official `generate_voice_design` hands `generate` for the case (recorded
    there; nothing runs). The case's `auto` is left to the wrapper's default language."""
    from qwen_tts import Qwen3TTSModel

    box: dict[str, Any] = {}

    def record(**kwargs):
        box.update(kwargs)
        raise _Recorded

    tts.generate = record
    try:
        Qwen3TTSModel(tts, ByteProcessor()).generate_voice_design(
            text=case.text,
            instruct=case.instruct,
            language=None if case.language == "auto" else case.language.capitalize(),
            non_streaming_mode=case.non_streaming,
        )
    except _Recorded:
        pass
    finally:
        del tts.generate
    return {k: box.get(k) for k in INPUT_KEYS}


@torch.no_grad()
def prompt(tts, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The prompt embeddings, trailing text and tts_pad `generate` hands the talker."""
    box = official._talker_inputs(tts, **inputs)
    return {
        "embeds": box["inputs_embeds"][0].clone(),
        "trailing": box["trailing_text_hidden"][0].clone(),
        "tts_pad": box["tts_pad_embed"][0, 0].clone(),
    }


@torch.no_grad()
def greedy(tts, inputs: dict[str, Any], max_new_tokens: int) -> torch.Tensor:
    codes, _ = tts.generate(
        **inputs, max_new_tokens=max_new_tokens, do_sample=False, subtalker_dosample=False
    )
    return codes[0]


def outputs(tts, codec, model: ModelConfig) -> dict[str, torch.Tensor]:
    """Every VoiceDesign quantity: the ids the wrapper tokenized, prompt embeddings,
    teacher-forced logits, greedy codes (the codec is official.outputs' comparison)."""
    out: dict[str, torch.Tensor] = {}
    recorded = {}
    for case in DESIGN_CASES:
        inputs = recorded[case.name] = wrapper_inputs(tts, case)
        assert inputs["speakers"] is None and inputs["languages"][0].lower() == case.language
        assert inputs["non_streaming_mode"] is case.non_streaming
        out[f"design/{case.name}/input_ids"] = inputs["input_ids"][0][0]
        out[f"design/{case.name}/instruct_ids"] = inputs["instruct_ids"][0][0]
        for key, value in prompt(tts, inputs).items():
            out[f"design/{case.name}/{key}"] = value
    for name in DESIGN_LOGIT_CASES:
        frames = random_codes(f"decode/{name}", (DECODE_FRAMES, 16), model.codec.codebook_size)
        forced = official.teacher_forced(tts, prompt(tts, recorded[name]), frames)
        out[f"logits/{name}/frames"] = frames
        out[f"logits/{name}/embeds"] = forced["embeds"]
        out[f"logits/{name}/logits"] = forced["logits"]
    for name in DESIGN_GREEDY_CASES:
        out[f"greedy/{name}/codes"] = greedy(tts, recorded[name], GREEDY_MAX_NEW_TOKENS)
    return {k: v.detach().contiguous() for k, v in out.items()}
