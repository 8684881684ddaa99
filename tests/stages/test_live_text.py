"""Incremental text (`core/live.py`, `models/qwen3_tts/live_text.py`): a request that starts
with its first words and gets the rest while it runs makes the codes of its whole text sent
at once in the streaming layout; it sits out (text-starved) without a deadline while its text
has not arrived, and costs the others nothing; text it cannot take ends it with an error."""

from __future__ import annotations

import pytest

from omniflow.engine.messages import ExtendInput
from omniflow.models.qwen3_tts.live_text import LiveText
from omniflow.models.qwen3_tts.prompt import PromptError
from omniflow.sched.playback import PlaybackClock
from tests.factories import speech, talker_engine
from tests.stages.test_talker_engine import collect

TEXT = "The quick brown fox jumps, twice."
PIECES = ["The qu", "ick brown ", "fox", " jumps,", " twice."]


def whole(rid: str = "a", seed: int = 5) -> object:
    return speech(
        rid, TEXT, seed=seed, max_new_tokens=40, ignore_eos=True, non_streaming_mode=False
    )


def run_live(steps_between: int, **engine_kw) -> tuple[dict, list[int], object]:
    """Feed PIECES with `steps_between` engine steps after each; returns the codes, the
    frames made before the text was done, and the engine."""
    engine, proc = talker_engine(**engine_kw)
    first = speech(
        "a", PIECES[0] + PIECES[1], seed=5, max_new_tokens=40, ignore_eos=True, incremental=True
    )
    engine.add_request(proc.make_request(first))
    outputs, before_done = [], []
    for i, piece in enumerate([*PIECES[2:], ""]):
        for _ in range(steps_between):
            outputs.extend(engine.step())
        before_done.append(sum(len(o.tokens) for o in outputs))
        outputs.extend(engine.apply(ExtendInput("a", piece, done=i == len(PIECES) - 2)))
    outputs.extend(engine.run_until_idle())
    return collect(outputs), before_done, engine


@pytest.mark.parametrize(
    "engine_kw", [{}, {"async_scheduling": True}, {"window_k": 4, "async_scheduling": True}]
)
def test_text_in_pieces_makes_the_codes_of_the_whole_text(engine_kw):
    engine, proc = talker_engine(**engine_kw)
    engine.add_request(proc.make_request(whole()))
    want = collect(engine.run_until_idle())
    got, before_done, _ = run_live(6, **engine_kw)
    assert got == want and len(got["a"]) == 40
    assert 0 < before_done[-1] < 40  # audio was made before the text was done


def test_a_starved_request_waits_for_its_text_and_the_others_go_on():
    engine, proc = talker_engine()
    engine.add_request(
        proc.make_request(
            speech(
                "live", "Hello there ", seed=1, max_new_tokens=40, ignore_eos=True, incremental=True
            )
        )
    )
    engine.add_request(
        proc.make_request(speech("other", seed=2, max_new_tokens=20, ignore_eos=True))
    )
    outputs = []
    for _ in range(40):
        outputs.extend(engine.step())
    made = collect(outputs)
    # "Hello there" is committed ("there" ends at the space): its first token in the prompt,
    # then one decode step per later token: 11 tokens allow 11 frames, no more
    assert len(made["live"]) == len("Hello there") and len(made["other"]) == 20
    assert engine.scheduler.requests["live"].input_room == 0  # starved, still resident
    outputs = engine.apply(ExtendInput("live", "you.", done=True)) + engine.run_until_idle()
    assert len(collect(outputs)["live"]) == 40 - len("Hello there")


@pytest.mark.parametrize(("residents", "seated"), [(None, 2), (6, 4)])
def test_starved_streams_hold_slots_not_turns(residents, seated):
    """Two text-starved streams hold two of four rows' residents by default (max_num_seqs:
    each holds a decoder slot); with room for more residents (max_resident_seqs) they take
    no turn at the rows, and four new requests are seated beside them at once (a class of
    four rows never measured, since only the two ever ran)."""
    engine, proc = talker_engine(max_num_seqs=4, max_resident_seqs=residents, window_k=4)
    engine.scheduler.playback = PlaybackClock(0.08, 0.04)
    for i in range(2):
        live = speech(f"live{i}", "Hi you ", seed=i, max_new_tokens=30, incremental=True)
        engine.add_request(proc.make_request(live))
    for _ in range(10):
        engine.step()
    assert all(engine.scheduler.requests[f"live{i}"].input_room == 0 for i in range(2))
    new = {f"new{i}" for i in range(4)}
    for i, rid in enumerate(sorted(new)):
        engine.add_request(proc.make_request(speech(rid, seed=9 + i, max_new_tokens=5)))
    engine.step()
    assert len({r.request_id for r in engine.scheduler.running} & new) == seated


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_starved_stream_has_no_deadline_and_resumes_a_frame_ahead(async_scheduling):
    now = [100.0]
    engine, proc = talker_engine(window_k=4, async_scheduling=async_scheduling)
    clock = engine.scheduler.playback = PlaybackClock(0.08, 0.04, now=lambda: now[0])
    engine.add_request(
        proc.make_request(
            speech("live", "Hi you ", seed=1, max_new_tokens=30, incremental=True, ignore_eos=True)
        )
    )
    live = engine.scheduler.requests["live"]
    for _ in range(10):  # async: until it starves with its last frame still in flight
        engine.step()
        if live.input_room == 0 and (live.num_placeholders > 0) == async_scheduling:
            break
    assert live.input_room == 0
    now[0] = 200.0  # long after its audio ran out: it waited for text, it is not late
    assert engine.stats().min_slack_s is None
    engine.apply(ExtendInput("live", "there.", done=False))
    assert (live.num_placeholders > 0) == async_scheduling  # async: frames still in flight
    # once its frames so far are out, the next is due a frame later, as after a first
    # frame: 80 - 40 ms of slack
    assert clock.slack("live", live.num_generated, 200.0) == pytest.approx(0.08 - 0.04)


def test_text_it_cannot_take_ends_it_with_an_error():
    engine, proc = talker_engine()
    engine.add_request(proc.make_request(speech("plain", seed=1, max_new_tokens=8)))
    out = engine.apply(ExtendInput("plain", "more", done=False))
    assert out[0].finish_reason == "error" and "not started incremental" in out[0].error
    engine.add_request(
        proc.make_request(speech("live", "Hi you ", seed=1, max_new_tokens=8, incremental=True))
    )
    assert engine.apply(ExtendInput("live", "", done=True)) == []
    out = engine.apply(ExtendInput("live", "late", done=False))
    assert out[0].finish_reason == "error" and "input.done" in out[0].error
    assert engine.apply(ExtendInput("gone", "x", done=True)) == []  # ended: ignored


def test_only_settled_tokens_are_committed():
    def encode(text: str) -> list[int]:  # "ab" is one token only when whole, like a BPE merge
        return [ord(c) for c in text.replace("ab", "\x01")]

    live = LiveText(encode, eos_id=0, text="x a")
    assert live.ids == [ord("x")] and live.tokens_allowed() == 1
    live.extend("b c", done=False)  # "x ab c": "x ab" settled
    assert live.ids == encode("x ab")
    live.extend("", done=True)
    assert live.ids == encode("x ab c") and live.tokens_allowed() is None
    assert live.trailing_at(len(live.ids) - 1, pad_id=9) == 0  # then the end of text
    assert live.trailing_at(len(live.ids), pad_id=9) == 9  # then padding
    with pytest.raises(PromptError, match="whole word"):
        LiveText(encode, eos_id=0, text="Hel")


def test_text_in_many_pieces_is_tokenized_once_plus_its_tails():
    """Each piece tokenizes only the text after the committed part (the engine thread does
    this), and the whole text once when it ends: linear in the text, not quadratic."""
    seen: list[int] = []

    def encode(text: str) -> list[int]:
        seen.append(len(text))
        return [ord(c) for c in text]

    live = LiveText(encode, eos_id=0, text="go ")
    for _ in range(300):
        live.extend("word ", done=False)
    live.extend("end.", done=True)
    assert live.ids == [ord(c) for c in live.text]
    assert sum(seen) < 6 * len(live.text)  # the whole text each time: ~600 times as much


def test_a_tokenizer_that_joins_words_is_caught_when_the_text_ends():
    def encode(text: str) -> list[int]:  # "a b" is one token: a merge across a space
        return [ord(c) for c in text.replace("a b", "\x01")]

    live = LiveText(encode, eos_id=0, text="x a ")
    live.extend("b", done=False)
    with pytest.raises(ValueError, match="already spoken position"):
        live.extend("", done=True)


@pytest.mark.parametrize(
    "pieces", [["Hello there", "\nyou."], ["Hello there\n", "you."], ["Hi you ", "all.\n"]]
)
def test_a_newline_after_a_committed_word_keeps_the_whole_texts_tokens(tmp_path, pieces):
    """A BPE tokenizer with Qwen2's "\n\n" merge: a tail that starts with a newline,
    tokenized alone, would follow the chat frame's newline and merge with it."""
    import json

    from omniflow.models.qwen3_tts.tokenizer import ROLE_LEN, SUFFIX_LEN, BPETokenizer
    from tests.models.test_prompt_tokenizer import write_bpe

    write_bpe(tmp_path)
    vocab = json.loads((tmp_path / "vocab.json").read_text())
    vocab["ĊĊ"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text((tmp_path / "merges.txt").read_text() + "Ċ Ċ\n")
    tok = BPETokenizer(tmp_path, (7, 8, 9))

    def body(text: str) -> list[int]:
        return tok.encode_chat(text)[ROLE_LEN:-SUFFIX_LEN]

    live = LiveText(body, eos_id=9, text=pieces[0])
    for piece in pieces[1:]:
        live.extend(piece, done=False)
    live.extend("", done=True)
    assert live.ids == body(live.text)


def test_an_incremental_request_refuses_the_whole_text_layout():
    _, proc = talker_engine()
    with pytest.raises(PromptError, match="streaming text layout"):
        proc.make_request(speech("a", "Hi you ", incremental=True, non_streaming_mode=True))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_window_beside_a_live_request_stops_where_its_text_does(async_scheduling):
    kw = {"window_k": 4, "async_scheduling": async_scheduling}
    alone, proc = talker_engine(**kw)
    alone.add_request(
        proc.make_request(speech("other", seed=1, max_new_tokens=30, ignore_eos=True))
    )
    want = collect(alone.run_until_idle())["other"]
    engine, proc = talker_engine(**kw)
    engine.add_request(
        proc.make_request(speech("other", seed=1, max_new_tokens=30, ignore_eos=True))
    )
    live = speech(
        "live", "Hello there ", seed=2, max_new_tokens=30, ignore_eos=True, incremental=True
    )
    engine.add_request(proc.make_request(live))
    outputs = []
    for _ in range(40):
        outputs.extend(engine.step())
    assert not [o for o in outputs if o.error]  # no step read text that had not come
    assert collect(outputs)["other"] == want
    assert len(collect(outputs)["live"]) == len("Hello there")  # all its text allows


def test_a_starved_request_preempted_does_not_hold_back_the_queue():
    engine, proc = talker_engine(block_size=4, num_kv_blocks=40)
    s = engine.scheduler
    engine.add_request(
        proc.make_request(speech("big", seed=1, max_new_tokens=120, ignore_eos=True))
    )
    live = speech(
        "live", "Hello there ", seed=2, max_new_tokens=60, ignore_eos=True, incremental=True
    )
    engine.add_request(proc.make_request(live))
    while not s.num_preemptions:  # the KV pool runs out: the newest, the starved one, goes
        engine.step()
    assert [r.request_id for r in s.waiting] == ["live"] and s.requests["live"].input_room == 0
    engine.add_request(
        proc.make_request(speech("new", "Hi.", seed=3, max_new_tokens=10, ignore_eos=True))
    )
    outputs = []
    for _ in range(150):
        outputs.extend(engine.step())
    ended = {o.request_id for o in outputs if o.finished}
    assert "new" in ended and "live" in s.requests  # served while the live one waits
    outputs = engine.apply(ExtendInput("live", "you.", done=True)) + engine.run_until_idle()
    assert "live" in {o.request_id for o in outputs if o.finished}


def test_dummy_weights_cap_a_live_request_at_its_whole_texts_length():
    from omniflow.build.qwen3_tts import text_length_requests

    text = "a b c d e f g h i j k l m n o p q r s t u v w x y z "
    frames = {}
    for live in (True, False):
        engine, proc = talker_engine()
        make = text_length_requests(proc.make_request)
        engine.add_request(
            make(speech("a", text, seed=3, incremental=live, non_streaming_mode=False))
        )
        outputs = []
        if live:
            for _ in range(60):  # runs as far as its text allows, then waits
                outputs.extend(engine.step())
            outputs.extend(engine.apply(ExtendInput("a", "", done=True)))
        outputs.extend(engine.run_until_idle())
        frames[live] = collect(outputs)["a"]
    assert frames[True] == frames[False]


@pytest.mark.parametrize("engine_kw", [{}, {"window_k": 4, "async_scheduling": True}])
def test_the_output_that_shows_the_end_of_the_text_taken_says_when(engine_kw):
    """Issue 37's tail is timed from here: exactly one output carries `text_done_at`, the one
    whose tokens include the one sampled by the step that took `tts_eos` (decode step
    end_step() samples output token end_step() + 1), and never before input.done."""
    engine, proc = talker_engine(**engine_kw)
    first = speech(
        "a", PIECES[0] + PIECES[1], seed=5, max_new_tokens=40, ignore_eos=True, incremental=True
    )
    req = proc.make_request(first)
    engine.add_request(req)
    outputs = []
    for piece in PIECES[2:-1]:
        outputs.extend(engine.step())
        outputs.extend(engine.apply(ExtendInput("a", piece, done=False)))
    for _ in range(30):  # starved before input.done: nothing says the text ended
        outputs.extend(engine.step())
    assert all(o.text_done_at is None for o in outputs)
    outputs.extend(engine.apply(ExtendInput("a", PIECES[-1], done=True)))
    outputs.extend(engine.run_until_idle())
    end = req.live.end_step()
    stamped = [i for i, o in enumerate(outputs) if o.text_done_at is not None]
    assert len(stamped) == 1 and outputs[stamped[0]].text_done_at == req.text_done_at
    made = 0
    for o in outputs[: stamped[0]]:
        made += len(o.tokens)
    out = outputs[stamped[0]]
    assert made < end + 2 <= made + len(out.tokens)
    assert out.text_done_after == made + len(out.tokens) - (end + 2)  # a window's later steps
