"""With dummy weights a request's length follows its text (a speaking-rate estimate), as a
real model's does; fixed-length requests keep their length; real weights keep EOS."""

from __future__ import annotations

import pytest

from omniflow.build.qwen3_tts import FRAME_RATE, speech_frames, speech_seconds
from tests.factories import Collector, build, speech

LONG = "The quick brown fox jumps over the lazy dog, and then it runs far away."


def frames_of(orch, req) -> int:
    c = Collector()
    orch.submit(req, c)
    return c.wait().terminal.frames


def test_the_estimate_is_a_normal_speaking_rate():
    assert 0.7 <= speech_seconds("Hello there.") <= 1.3  # about a second
    assert speech_frames("Hello there.") == round(speech_seconds("Hello there.") * FRAME_RATE)
    assert 4 <= speech_seconds(LONG) <= 7  # 15 words: about 150 words a minute
    assert speech_seconds("你好，世界。") > speech_seconds("ni hao, shi jie.")  # syllables
    assert speech_frames(".") == 2  # the model's minimum


@pytest.fixture(scope="module")
def fused():
    orch = build("qwen3_tts_fused")
    yield orch
    orch.stop()


def test_dummy_length_follows_the_text(fused):
    short = frames_of(fused, speech("s", "Hello there."))
    long = frames_of(fused, speech("l", LONG))
    assert short == speech_frames("Hello there.")
    assert long == speech_frames(LONG) > 4 * short


def test_a_callers_cap_and_fixed_length_requests_are_kept(fused):
    assert frames_of(fused, speech("cap", LONG, max_new_tokens=7)) == 7
    fixed = speech("fixed", "Hi.", max_new_tokens=40, ignore_eos=True)
    assert frames_of(fused, fixed) == 40 > speech_frames("Hi.")


def test_real_weights_keep_eos_driven_length(tmp_path):
    """The same weights loaded as a checkpoint: no estimate, the request runs until EOS or
    its cap (these weights rarely sample EOS, so the cap)."""
    from omniflow.models.qwen3_tts.codec_loader import save_codec
    from omniflow.models.qwen3_tts.codec_modules import SpeechTokenizerWeights, init_dummy_codec
    from omniflow.models.qwen3_tts.loader import save_talker
    from omniflow.models.qwen3_tts.modules import Qwen3TTSTalkerWeights, init_dummy
    from omniflow.models.qwen3_tts.vocab import CodecVocab
    from tests.factories import tiny_model_config

    cfg = tiny_model_config()
    talker = Qwen3TTSTalkerWeights(cfg.talker, cfg.code_predictor)
    init_dummy(talker, cfg.seed)
    ids = {"tts_pad_token_id": 259, "tts_bos_token_id": 260, "tts_eos_token_id": 261}
    save_talker(talker, tmp_path, CodecVocab(), ids)
    codec = SpeechTokenizerWeights(cfg.codec)
    init_dummy_codec(codec, cfg.seed + 1)
    save_codec(codec, tmp_path)
    loaded = build("qwen3_tts_fused", f"model.path={tmp_path}", "model.tokenizer=byte")
    try:
        assert frames_of(loaded, speech("real", "Hello there.", max_new_tokens=30)) == 30
    finally:
        loaded.stop()
