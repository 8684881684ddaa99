"""The sentence splitter of the WebSocket endpoint (serve/sentences.py): text arriving in
pieces, cut where a sentence is known to be complete."""

from __future__ import annotations

import pytest

from omniflow.serve.sentences import SentenceBuffer


def split(*pieces: str) -> list[str]:
    buffer = SentenceBuffer()
    out = [s for piece in pieces for s in buffer.feed(piece)]
    rest = buffer.flush()
    return out + ([rest] if rest is not None else [])


def test_a_sentence_ends_at_whitespace_after_its_terminator():
    buffer = SentenceBuffer()
    assert buffer.feed("Hello the") == []
    assert buffer.feed("re.") == []  # the next piece may continue the word
    assert buffer.feed(" How are you? Fi") == ["Hello there.", "How are you?"]
    assert buffer.flush() == "Fi"
    assert buffer.flush() is None


@pytest.mark.parametrize(
    ("pieces", "sentences"),
    [
        (["Pi is 3.", "14 or so. Yes"], ["Pi is 3.14 or so.", "Yes"]),
        (["Wait... ", "what?! ", "No!"], ["Wait...", "what?!", "No!"]),
        (['He said "no." Then ', "left."], ['He said "no."', "Then left."]),
        (["(Really.) Ok"], ["(Really.)", "Ok"]),
        (["你好。今天", "「好」！再见"], ["你好。", "今天「好」！", "再见"]),
        (["真的？", "是的"], ["真的？", "是的"]),
        (["No terminator at all"], ["No terminator at all"]),
        (["  ", "\n"], []),
        (["One.\nTwo."], ["One.", "Two."]),
    ],
)
def test_sentences(pieces, sentences):
    assert split(*pieces) == sentences


def test_a_piece_may_hold_many_sentences_or_one_character():
    text = "First one. Second one! Third one? Fourth"
    assert split(text) == split(*text) == ["First one.", "Second one!", "Third one?", "Fourth"]


def test_clear_drops_the_text():
    buffer = SentenceBuffer()
    buffer.feed("Half a sent")
    assert len(buffer) == 11
    buffer.clear()
    assert buffer.flush() is None
