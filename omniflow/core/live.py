"""Input that is still arriving while its request runs (live text over a WebSocket).

A request whose model reads one input token per decode step (Qwen3-TTS's streaming text
layout) can start before its text is whole. The scheduler reads one number from it,
`tokens_allowed`: past that the request is text-starved and sits out, keeping its KV blocks
and decoder state, with no playback deadline until its text arrives (docs/websocket.md,
incremental mode). Only the engine thread extends it (`engine/messages.py` `ExtendInput`)."""

from __future__ import annotations

import re
from typing import Protocol

_LAST_SPACE = re.compile(r"\s+\S*$")


class LiveInput(Protocol):
    """The scheduler's view of a request's arriving input."""

    def tokens_allowed(self) -> int | None:
        """How many tokens the request may have sampled with the input received so far
        (None: its input is complete)."""
        ...

    def extend(self, text: str, done: bool) -> None:
        """More input, and whether it is the last; ValueError when it cannot be taken."""
        ...

    def end_step(self) -> int | None:
        """The decode step that takes the end of the input (its end-of-text token), once the
        input is complete; None while it is still arriving."""
        ...

    def length_cap(self) -> int | None:
        """Once the input is complete, the most tokens it may make in all (dummy weights
        follow the text's length, `build/qwen3_tts.py`); None: no cap of its own."""
        ...


def settled_text(text: str) -> str:
    """The part of arriving text whose tokens cannot change when more arrives: up to the last
    run of whitespace that follows a letter or a digit (a tokenizer splits words there, and
    no later character joins the word before it). Empty while no word is complete."""
    cut = text
    while (m := _LAST_SPACE.search(cut)) is not None:
        head = cut[: m.start()]
        if head and head[-1].isalnum():
            return head
        cut = head
    return ""
