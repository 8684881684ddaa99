"""The whole-text prompt layout (`non_streaming_mode`), dialect speakers and the languages a
request may name. The official embeddings for the same layouts are compared in
tests/reference/test_reference_fixtures.py; these pin the id layout itself."""

from __future__ import annotations

import pytest

from omniflow.core.speech import SpeechRequest
from omniflow.models.qwen3_tts.processor import DEFAULT_NON_STREAMING, TalkerProcessor
from omniflow.models.qwen3_tts.prompt import NO_CODEC, PromptError, build_prompt
from omniflow.models.qwen3_tts.tokenizer import ByteTokenizer
from omniflow.models.qwen3_tts.vocab import CodecVocab

V = CodecVocab()
TOK = ByteTokenizer()
S = TOK.specials


def test_whole_text_layout_puts_every_text_token_in_the_prompt():
    p = build_prompt(TOK.encode_chat("abc"), S, V, "vivian", "english", non_streaming=True)
    head = [V.think, V.think_bos, V.languages["english"], V.think_eos, V.speakers["vivian"], V.pad]
    assert list(p.codec_ids) == [NO_CODEC] * 3 + head + [V.pad] * 4 + [V.bos]
    assert list(p.text_ids) == (
        [S.im_start, S.assistant, S.newline]
        + [S.tts_pad] * 5
        + [S.tts_bos]
        + [ord("a"), ord("b"), ord("c"), S.tts_eos, S.tts_pad]
    )
    assert p.trailing_text == () and p.trailing_at(0) == p.trailing_at(9) == S.tts_pad


def test_the_two_layouts_share_the_head_and_differ_after_it():
    chat = TOK.encode_chat("hello")
    stream = build_prompt(chat, S, V, "ryan", "auto", non_streaming=False)
    whole = build_prompt(chat, S, V, "ryan", "auto", non_streaming=True)
    n = stream.prompt_len - 1
    assert whole.text_ids[:n] == stream.text_ids[:n] and whole.codec_ids[:n] == stream.codec_ids[:n]
    assert whole.prompt_len == stream.prompt_len + len("hello") + 1
    assert stream.trailing_text == (*b"ello", S.tts_eos)


@pytest.mark.parametrize(
    ("speaker", "language", "expected"),
    [
        ("dylan", "chinese", "beijing_dialect"),
        ("dylan", "auto", "beijing_dialect"),  # auto becomes the think prefix with the dialect
        ("eric", "chinese", "sichuan_dialect"),
        ("eric", "Auto", "sichuan_dialect"),
        ("dylan", "english", "english"),  # other languages are left alone
        ("vivian", "chinese", "chinese"),
        ("vivian", "auto", None),
        (None, "chinese", "chinese"),
    ],
)
def test_dialect_speakers_switch_the_language_id(speaker, language, expected):
    p = build_prompt(TOK.encode_chat("x"), S, V, speaker, language)
    prefix = list(p.codec_ids[3:6])
    if expected is None:
        assert prefix == [V.nothink, V.think_bos, V.think_eos]
    else:
        assert prefix == [V.think, V.think_bos, V.languages[expected]]


@pytest.mark.parametrize("language", ["beijing_dialect", "sichuan_dialect"])
def test_dialects_are_not_languages_a_request_names(language):
    with pytest.raises(PromptError, match="unknown language"):
        build_prompt(TOK.encode_chat("x"), S, V, "dylan", language)
    proc = TalkerProcessor(TOK, V, 512)
    assert language not in proc.languages and "chinese" in proc.languages


def test_request_field_picks_the_layout_and_unset_means_the_default():
    proc = TalkerProcessor(TOK, V, 512)

    def layout(flag):
        speech = SpeechRequest.create("hello", voice="vivian", non_streaming_mode=flag)
        return proc.make_request(speech).payload

    whole, stream, default = layout(True), layout(False), layout(None)
    assert whole.trailing_text == () and stream.trailing_text != ()
    assert DEFAULT_NON_STREAMING is True and default == whole
