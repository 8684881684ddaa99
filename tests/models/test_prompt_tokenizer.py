"""Tokenizers and the CustomVoice prompt layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import pre_tokenizers

from omniflow.models.qwen3_tts.prompt import NO_CODEC, PromptError, build_prompt
from omniflow.models.qwen3_tts.tokenizer import BPETokenizer, ByteTokenizer
from omniflow.models.qwen3_tts.vocab import CodecVocab

V = CodecVocab()


def write_bpe(d: Path) -> None:
    """A tiny byte-level BPE in the Qwen2 file layout (vocab.json, merges.txt, config)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = []
    word = "assistant"
    cur = word[0]
    for ch in word[1:]:
        merges.append(f"{cur} {ch}")
        cur += ch
        vocab[cur] = len(vocab)
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    added = {
        str(1000 + i): {"content": t, "special": True}
        for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    }
    (d / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))


def test_byte_tokenizer_layout():
    tok = ByteTokenizer()
    ids = tok.encode_chat("hé")
    s = tok.specials
    assert ids[:3] == [s.im_start, s.assistant, s.newline]
    assert ids[3:-5] == list("hé".encode())
    assert ids[-5:] == [s.im_end, s.newline, s.im_start, s.assistant, s.newline]


def test_bpe_tokenizer_from_vocab_and_merges(tmp_path):
    write_bpe(tmp_path)
    tok = BPETokenizer(tmp_path, (7, 8, 9))
    ids = tok.encode_chat("hi")
    s = tok.specials
    assert len(ids) == 3 + 2 + 5
    assert ids[:3] == [s.im_start, s.assistant, s.newline]
    assert ids[-5:] == [s.im_end, s.newline, s.im_start, s.assistant, s.newline]
    assert (s.tts_pad, s.tts_bos, s.tts_eos) == (7, 8, 9)


def test_bpe_without_files_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        BPETokenizer(tmp_path, (1, 2, 3))


def test_prompt_layout_with_language_and_speaker():
    tok = ByteTokenizer()
    s = tok.specials
    p = build_prompt(tok.encode_chat("abc"), s, V, "vivian", "english")
    codec = [
        V.think,
        V.think_bos,
        V.languages["english"],
        V.think_eos,
        V.speakers["vivian"],
        V.pad,
        V.bos,
    ]
    assert p.prompt_len == 3 + len(codec)
    assert list(p.codec_ids) == [NO_CODEC] * 3 + codec
    assert list(p.text_ids) == (
        [s.im_start, s.assistant, s.newline]
        + [s.tts_pad] * (len(codec) - 2)
        + [s.tts_bos, ord("a")]
    )
    assert list(p.trailing_text) == [ord("b"), ord("c"), s.tts_eos]
    assert p.trailing_at(2) == s.tts_eos and p.trailing_at(3) == s.tts_pad


def test_prompt_auto_language_without_speaker():
    tok = ByteTokenizer()
    p = build_prompt(tok.encode_chat("x"), tok.specials, V, None, "auto")
    assert list(p.codec_ids[3:]) == [V.nothink, V.think_bos, V.think_eos, V.pad, V.bos]
    assert list(p.trailing_text) == [tok.specials.tts_eos]


@pytest.mark.parametrize(
    ("text", "voice", "language", "message"),
    [
        ("", "vivian", "auto", "empty"),
        ("hi", "nobody", "auto", "unknown voice"),
        ("hi", "vivian", "klingon", "unknown language"),
    ],
)
def test_prompt_errors(text, voice, language, message):
    tok = ByteTokenizer()
    with pytest.raises(PromptError, match=message):
        build_prompt(tok.encode_chat(text), tok.specials, V, voice, language)


def test_instruction_turn_comes_first_as_text_only_positions():
    tok = ByteTokenizer()
    s = tok.specials
    instruct = tok.encode_instruct("calm")
    assert instruct[0] == s.im_start and instruct[-2:] == [s.im_end, s.newline]
    assert bytes(instruct[1:-2]) == b"user\ncalm"
    plain = build_prompt(tok.encode_chat("abc"), s, V, "vivian", "auto")
    styled = build_prompt(tok.encode_chat("abc"), s, V, "vivian", "auto", instruct)
    assert styled.prompt_len == plain.prompt_len + len(instruct)
    assert list(styled.text_ids[: len(instruct)]) == instruct
    assert list(styled.codec_ids[: len(instruct)]) == [NO_CODEC] * len(instruct)
    assert styled.text_ids[len(instruct) :] == plain.text_ids
    assert styled.trailing_text == plain.trailing_text


def test_bpe_instruct_turn(tmp_path):
    write_bpe(tmp_path)
    tok = BPETokenizer(tmp_path, (7, 8, 9))
    ids = tok.encode_instruct("hi")
    assert ids[0] == tok.specials.im_start and ids[-2] == tok.specials.im_end


def test_processor_refuses_instructions_for_models_without_them():
    from omniflow.core.speech import SpeechRequest
    from omniflow.models.qwen3_tts.processor import TalkerProcessor

    proc = TalkerProcessor(ByteTokenizer(), V, 512, supports_instructions=False)
    with pytest.raises(PromptError, match="instructions"):
        proc.make_request(SpeechRequest("r", "hello", voice="vivian", instructions="calm"))
    assert proc.make_request(SpeechRequest("r", "hello", voice="vivian")).prompt_len > 0
