"""A request's voice and language checked from the model config alone (before a build)."""

from __future__ import annotations

import json

import pytest

from omniflow.errors import ConfigError
from omniflow.models.qwen3_tts.prompt_check import check_voice_and_language
from tests.factories import tiny_model_config


def test_dummy_weights_take_the_preset_speakers_and_languages():
    model = tiny_model_config()
    check_voice_and_language(model, "Vivian", "English")
    check_voice_and_language(model, None, "auto")  # a voice clone names no preset voice
    with pytest.raises(ConfigError) as exc:
        check_voice_and_language(model, "nobody", "english")
    assert exc.value.key == "voice" and "'nobody'" in exc.value.reason
    with pytest.raises(ConfigError) as exc:
        check_voice_and_language(model, "nobody", "klingon")  # the language is named first
    assert exc.value.key == "language" and "'klingon'" in exc.value.reason


def test_a_checkpoint_answers_with_its_own_speakers(tmp_path):
    """The speakers of the checkpoint's config.json, as the built talker will have them."""
    talker = {"spk_id": {"Alice": 3000}, "codec_language_id": {"english": 2050}}
    (tmp_path / "config.json").write_text(json.dumps({"talker_config": talker}))
    model = tiny_model_config().model_copy(update={"load": "checkpoint", "path": str(tmp_path)})
    check_voice_and_language(model, "alice", "english")
    with pytest.raises(ConfigError) as exc:
        check_voice_and_language(model, "vivian", "english")
    assert exc.value.key == "voice" and "known: ['alice']" in exc.value.reason
    with pytest.raises(ConfigError) as exc:
        check_voice_and_language(model, "alice", "german")
    assert exc.value.key == "language"
