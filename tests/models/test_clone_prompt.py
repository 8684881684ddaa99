"""Voice clone (Base models): the in-context and speaker-embedding-only prompt layouts, the
request checks, and the speaker embedding through the engine's batched prefill. The official
embeddings for the same layouts are compared in tests/reference/test_reference_fixtures.py;
these pin the id layout and the serving path."""

from __future__ import annotations

import pytest
import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.core.speech import SpeechRequest
from omniflow.engine.stage_engine import StageEngine
from omniflow.models.interface import PositionSpan
from omniflow.models.qwen3_tts import inputs
from omniflow.models.qwen3_tts.ar_model import build_ar_model
from omniflow.models.qwen3_tts.codec_encoder import CodecEncoderShape, load_codec_encoder
from omniflow.models.qwen3_tts.processor import CloneShape, TalkerProcessor
from omniflow.models.qwen3_tts.prompt import NO_CODEC, PromptError, build_clone_prompt
from omniflow.models.qwen3_tts.reference import encode_reference
from omniflow.models.qwen3_tts.speaker_encoder import SpeakerEncoderShape, load_speaker_encoder
from omniflow.models.qwen3_tts.tokenizer import ByteTokenizer
from omniflow.models.qwen3_tts.vocab import CodecVocab
from omniflow.sched.ar import ARScheduler
from omniflow.worker.ar_runner import ARModelRunner
from tests.factories import tiny_bundle, tiny_model_config
from tests.reference.cases import make_audio

V = CodecVocab()
TOK = ByteTokenizer()
S = TOK.specials
EMB = torch.arange(64, dtype=torch.float32) / 64
HEAD_TEXT = [S.im_start, S.assistant, S.newline] + [S.tts_pad] * 5 + [S.tts_bos]
HEAD_CODEC = [NO_CODEC] * 3 + [V.think, V.think_bos, V.languages["english"], V.think_eos]
HEAD_CODEC += [NO_CODEC, V.pad]  # the speaker slot holds the embedding, then codec pad


def frames(n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple((7 * i + g) % 2048 for g in range(16)) for i in range(n))


def clone(text: str, ref: str | None, n: int, non_streaming: bool):
    ref_ids = None if ref is None else list(ref.encode())
    return build_clone_prompt(
        TOK.encode_chat(text), S, V, "english", EMB, ref_ids, frames(n), non_streaming
    )


def test_in_context_streaming_text_longer_than_the_reference():
    p = clone("hello", "hi", 3, non_streaming=False)  # text: h i h e l l o eos; codec: bos + 3
    assert list(p.text_ids) == HEAD_TEXT + [*b"hihe"]
    assert list(p.codec_ids) == HEAD_CODEC + [V.bos, NO_CODEC, NO_CODEC, NO_CODEC]
    assert p.ref_start == len(HEAD_TEXT) + 1 and p.ref_frames == frames(3)
    assert p.trailing_text == (*b"llo", S.tts_eos)
    assert p.speaker_pos == 7 and p.text_ids[7] == S.tts_pad and p.speaker_embedding is EMB


def test_in_context_streaming_text_shorter_than_the_reference_is_padded():
    p = clone("a", "b", 5, non_streaming=False)  # text: b a eos; codec: bos + 5
    assert list(p.text_ids) == HEAD_TEXT + [*b"ba", S.tts_eos] + [S.tts_pad] * 3
    assert p.trailing_text == () and p.trailing_at(0) == S.tts_pad
    assert p.ref_frame_at(p.ref_start + 4) == frames(5)[4] and p.ref_frame_at(p.prompt_len) is None


def test_in_context_whole_text_puts_the_text_before_the_reference_codes():
    p = clone("ab", "c", 2, non_streaming=True)
    assert list(p.text_ids) == HEAD_TEXT + [*b"cab", S.tts_eos] + [S.tts_pad] * 3
    assert list(p.codec_ids) == HEAD_CODEC + [V.pad] * 4 + [V.bos, NO_CODEC, NO_CODEC]
    assert p.ref_start == p.prompt_len - 2 and p.trailing_text == ()


@pytest.mark.parametrize("non_streaming", [False, True])
def test_speaker_embedding_only_is_the_custom_voice_layout_with_the_vector(non_streaming):
    p = clone("hey", None, 0, non_streaming)
    assert p.ref_frames == () and p.ref_frame_at(p.prompt_len - 1) is None
    assert list(p.codec_ids[: len(HEAD_CODEC)]) == HEAD_CODEC
    if non_streaming:  # h e y eos + codec pad, then tts_pad + codec bos
        assert list(p.text_ids[len(HEAD_TEXT) :]) == [*b"hey", S.tts_eos, S.tts_pad]
        assert p.trailing_text == ()
    else:  # h + codec bos; e y eos trail
        assert list(p.text_ids[len(HEAD_TEXT) :]) == [ord("h")]
        assert p.trailing_text == (*b"ey", S.tts_eos)
    assert p.codec_ids[-1] == V.bos


TINY_CLONE = CloneShape(64, 16, 2048)


def processor(clone_shape: CloneShape | None = TINY_CLONE) -> TalkerProcessor:
    return TalkerProcessor(TOK, V, 512, clone=clone_shape)


def request(**kw) -> SpeechRequest:
    base = {"speaker_embedding": tuple(EMB.tolist()), "language": "english"}
    return SpeechRequest.create("hello", **{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"speaker_embedding": (0.0,) * 63}, "speaker_embedding must be 64"),
        ({"speaker_embedding": (float("nan"),) * 64}, "finite"),
        ({"ref_codes": frames(2)}, "needs ref_text"),
        ({"ref_codes": frames(2), "ref_text": "  "}, "needs ref_text"),
        ({"ref_codes": (), "ref_text": "x"}, "ref_codes is empty"),
        ({"ref_codes": ((1,) * 15,), "ref_text": "x"}, "16 codes"),
        ({"ref_codes": ((2048,) * 16,), "ref_text": "x"}, r"\[0, 2048\)"),
        ({"ref_text": "x"}, "ref_text needs ref_codes"),
        ({"voice": "vivian"}, "names no voice"),
        ({"instructions": "slowly"}, "instructions"),
        ({"speaker_embedding": None, "ref_codes": frames(1), "ref_text": "x"}, "speaker_embedding"),
    ],
)
def test_bad_clone_requests_are_refused(kw, message):
    with pytest.raises(PromptError, match=message):
        processor().make_request(request(**kw))


def test_a_model_without_a_speaker_encoder_refuses_clone_requests():
    with pytest.raises(PromptError, match="does not clone voices"):
        processor(None).make_request(request())


def test_clone_defaults_to_streaming_text_as_the_official_voice_clone_does():
    plain = processor().make_request(request(ref_codes=frames(2), ref_text="x")).payload
    stream = (
        processor()
        .make_request(request(ref_codes=frames(2), ref_text="x", non_streaming_mode=False))
        .payload
    )
    assert plain == stream and plain.trailing_text != ()


def test_batched_prefill_adds_each_speaker_embedding_at_its_own_row():
    """A CustomVoice prompt and two clones in one prefill: every row is the row each
    request gets alone (up to the text projection's batch-size-dependent rounding), and the
    embedding moves only its speaker row."""
    talker = tiny_bundle().talker
    proc = processor()
    voice = proc.make_request(SpeechRequest.create("hi", voice="vivian")).payload
    a = proc.make_request(request(ref_codes=frames(3), ref_text="yo")).payload
    other = tuple((EMB * -2).tolist())
    b = proc.make_request(request(speaker_embedding=other)).payload

    def embeds(*ps):
        spans = [PositionSpan(p, p.prompt_len, 0, p.prompt_len, []) for p in ps]
        return inputs.embed_prefill(talker, inputs.prefill_inputs(spans, 16, torch.device("cpu")))

    together = embeds(voice, a, b)
    alone = torch.cat([embeds(voice), embeds(a), embeds(b)])
    assert torch.allclose(together, alone, rtol=0, atol=1e-6)
    c = proc.make_request(request(ref_codes=frames(3), ref_text="yo", speaker_embedding=other))
    diff = (embeds(c.payload) - embeds(a)).abs().sum(dim=1)
    assert diff.nonzero().flatten().tolist() == [a.speaker_pos]
    assert torch.allclose(diff[a.speaker_pos], (EMB * 3).abs().sum(), rtol=1e-5)


def test_a_clone_request_from_reference_audio_generates_and_depends_on_the_voice():
    """Reference audio -> the dummy encoders -> a request -> greedy frames from the engine."""
    m = tiny_model_config()
    audio = make_audio("clone", 9000)
    enc = load_codec_encoder(CodecEncoderShape.toy(m.codec), None, seed=0)
    spk = load_speaker_encoder(SpeakerEncoderShape.toy(m.talker.hidden_size), None, seed=0)
    ref = encode_reference(audio, enc, spk)
    assert len(ref.ref_codes) == 5 and len(ref.speaker_embedding) == m.talker.hidden_size
    assert torch.equal(torch.tensor(ref.ref_codes), enc.encode(audio[None])[0])

    def run(embedding: tuple[float, ...]) -> list:
        cfg = SchedulerConfig(max_model_len=256, block_size=4, num_kv_blocks=128)
        bundle = tiny_bundle()
        runner = ARModelRunner(build_ar_model(bundle), cfg, torch.device("cpu"), torch.float32)
        engine = StageEngine("talker", ARScheduler(cfg), runner)
        shape = CloneShape(m.talker.hidden_size, 16, m.codec.codebook_size)
        proc = TalkerProcessor(bundle.tokenizer, bundle.vocab, 256, clone=shape)
        speech = SpeechRequest.create(
            "hello",
            seed=0,
            temperature=0.0,
            max_new_tokens=4,
            ignore_eos=True,
            speaker_embedding=embedding,
            ref_codes=ref.ref_codes,
            ref_text="ref",
        )
        engine.add_request(proc.make_request(speech))
        return [f for o in engine.run_until_idle() for f in o.frames]

    mine = run(ref.speaker_embedding)
    assert len(mine) == 4 and None not in mine
    assert mine == run(ref.speaker_embedding)
    assert mine != run(tuple(-10 * v for v in ref.speaker_embedding))


def test_reference_audio_must_be_mono_and_non_empty():
    m = tiny_model_config()
    enc = load_codec_encoder(CodecEncoderShape.toy(m.codec), None, seed=0)
    spk = load_speaker_encoder(SpeakerEncoderShape.toy(m.talker.hidden_size), None, seed=0)
    with pytest.raises(ValueError, match="non-empty mono"):
        encode_reference(torch.zeros(0), enc, spk)
    with pytest.raises(ValueError, match="non-empty mono"):
        encode_reference(torch.zeros(2, 100), enc, spk)


def test_the_processor_lays_out_the_reference_transcript_as_the_builder_does():
    """ref_text goes in as the body of its chat string, the same ids as the prompt's text."""
    got = processor().make_request(request(ref_codes=frames(3), ref_text="hi")).payload
    assert got == clone("hello", "hi", 3, non_streaming=False)
