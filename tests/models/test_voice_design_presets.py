"""The VoiceDesign presets (`model=qwen3_tts_tiny_voicedesign`, `model=qwen3_tts_1_7b_voicedesign`):
they compose with the published model's shapes, the published VoiceDesign config.json passes
every cross-check and a checkpoint of another type is refused naming `tts_model_type` (both
ways), the preset keys that contradict a VoiceDesign model are refused, and the front end
takes a description and no voice. The fixture comparison with the official implementation
is tests/reference/test_voice_design_reference.py."""

from __future__ import annotations

import copy

import pytest

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.speech import SpeechRequest
from omniflow.errors import ConfigError
from omniflow.models.qwen3_tts.checkpoint_config import ConfigMismatch, check_talker_config
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.models.qwen3_tts.prompt import PromptError
from omniflow.models.qwen3_tts.prompt_check import prompt_facts
from omniflow.models.qwen3_tts.tokenizer import ByteTokenizer
from omniflow.models.qwen3_tts.vocab import dummy_vocab
from tests.models.test_base_presets import published_config


def preset(name: str, *overrides: str):
    return build_graph(compose(["platform=cpu", f"model={name}", *overrides])).model


def published_voice_design() -> dict:
    """config.json of Qwen3-TTS-12Hz-1.7B-VoiceDesign as published: the 1.7B talker, its
    type, no speakers, no speaker encoder."""
    cfg = copy.deepcopy(published_config("1b7"))
    del cfg["speaker_encoder_config"]
    cfg["tts_model_type"] = "voice_design"
    cfg["talker_config"]["spk_id"] = {}
    cfg["talker_config"]["spk_is_dialect"] = {}
    return cfg


@pytest.mark.parametrize(
    ("name", "sibling"),
    [
        ("qwen3_tts_1_7b_voicedesign", "qwen3_tts_1_7b"),
        ("qwen3_tts_tiny_voicedesign", "qwen3_tts_tiny"),
    ],
)
def test_a_voice_design_preset_is_its_custom_voice_sibling_with_no_speakers(name, sibling):
    m, s = preset(name), preset(sibling)
    assert (m.voice_design, m.task_type, s.task_type) == (True, "VoiceDesign", "CustomVoice")
    for part in ("talker", "code_predictor", "codec"):
        assert getattr(m, part) == getattr(s, part)
    assert m.supports_instructions and m.speaker_encoder is None and m.codec_encoder is None
    assert prompt_facts(m)[0] == () and prompt_facts(s)[0]  # no preset voices to list
    assert m.name == s.name.replace("customvoice", "voicedesign").replace(
        "tiny", "tiny-voicedesign"
    )


def test_the_published_config_passes_and_another_type_is_refused_naming_the_key():
    m = preset("qwen3_tts_1_7b_voicedesign")
    check_talker_config(published_voice_design(), m)
    for kind in ("custom_voice", "base", None):
        cfg = published_voice_design()
        cfg["tts_model_type"] = kind
        with pytest.raises(ConfigMismatch, match=f"tts_model_type = {kind!r}"):
            check_talker_config(cfg, m)
    # and a VoiceDesign checkpoint under the CustomVoice preset (it would serve no speakers)
    with pytest.raises(ConfigMismatch, match="tts_model_type = 'voice_design'.*voicedesign"):
        check_talker_config(published_voice_design(), preset("qwen3_tts_1_7b"))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model.supports_instructions=false"], "model.supports_instructions"),
        (
            [
                "model=qwen3_tts_tiny_base",
                "model.voice_design=true",
                "model.supports_instructions=true",
            ],
            "model.voice_design",
        ),
    ],
)
def test_keys_that_contradict_a_voice_design_model_are_refused(overrides, key):
    with pytest.raises(ConfigError) as exc:
        build_graph(compose(["platform=cpu", "model=qwen3_tts_tiny_voicedesign", *overrides]))
    assert exc.value.key == key


def test_the_front_end_takes_a_description_and_no_voice():
    """The prompt of a VoiceDesign request is the description's user turn and a codec prefix
    without a speaker id; one without a description, or naming a voice, is refused."""
    tok = ByteTokenizer()
    proc = TalkerProcessor(tok, dummy_vocab(True), 512, voice_design=True)
    assert proc.voices == ()
    ok = SpeechRequest.create("Hi.", request_id="a", instructions="A deep calm voice.")
    prompt = proc.make_request(ok).payload
    instruct = tok.encode_instruct("A deep calm voice.")
    assert list(prompt.text_ids[: len(instruct)]) == instruct
    custom = TalkerProcessor(tok, dummy_vocab(False), 512).make_request(
        SpeechRequest.create(
            "Hi.", request_id="b", voice="vivian", instructions="A deep calm voice."
        )
    )
    assert custom.payload.prompt_len == prompt.prompt_len + 1  # the speaker id's position
    for bad, says in (
        (SpeechRequest.create("Hi.", request_id="c"), "needs instructions"),
        (SpeechRequest.create("Hi.", request_id="d", instructions="  "), "needs instructions"),
        (
            SpeechRequest.create("Hi.", request_id="e", voice="vivian", instructions="x"),
            "names no voice",
        ),
    ):
        with pytest.raises(PromptError, match=says):
            proc.make_request(bad)
