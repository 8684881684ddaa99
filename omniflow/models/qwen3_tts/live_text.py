"""A request's text while it is still being written (incremental mode, docs/websocket.md).

In the streaming text layout (`non_streaming_mode=False`) the prompt holds the text's first
token and decode step s adds token s + 1, then `tts_eos`, then `tts_pad`. Text arriving in
pieces therefore extends the request while it runs; only tokens that cannot change when more
text comes are committed (`core/live.py` `settled_text`, checked against the tokens of all the
text received), so the committed tokens are those of the whole text tokenized at once: the
request makes the codes it would make with its whole text sent in the streaming layout."""

from __future__ import annotations

from collections.abc import Callable

from omniflow.core.live import settled_text
from omniflow.models.qwen3_tts.prompt import PromptError


class LiveText:
    """The committed text tokens of one request, growing on the engine thread."""

    def __init__(self, encode: Callable[[str], list[int]], eos_id: int, text: str) -> None:
        """`encode`: the text body's ids (no chat role or suffix); `text`: received so far."""
        self._encode = encode
        self.eos_id = eos_id
        self.text = text
        self.done = False
        self.ids: list[int] = []
        """The committed ids; ids[0] is in the prompt, ids[s + 1] goes in at decode step s."""
        self.committed_chars = 0
        """`text[:committed_chars]` is what `ids` are the tokens of."""
        self.cap: Callable[[str], int] | None = None
        """Frames its whole text allows (dummy weights' speaking-rate length), or None."""
        self._settle()
        if not self.ids:
            raise PromptError(
                "an incremental request starts with at least one whole word (text followed "
                "by a space); send more text before it starts"
            )

    def tokens_allowed(self) -> int | None:
        """Tokens it may sample: the prefill's, then one per committed token after the first
        (None once the text is done: then the end-of-text and padding follow)."""
        if self.done:
            return None
        # dummy weights: never past the length its text so far allows (the cap grows with it)
        return len(self.ids) if self.cap is None else min(len(self.ids), self.cap(self.text))

    def end_step(self) -> int | None:
        """`tts_eos` goes in at decode step len(ids) - 1 (`trailing_at`)."""
        return len(self.ids) - 1 if self.done else None

    def length_cap(self) -> int | None:
        return None if self.cap is None or not self.done else self.cap(self.text)

    def extend(self, text: str, done: bool) -> None:
        if self.done:
            raise ValueError("the request's text has ended: no text may follow input.done")
        self.text += text
        self.done = done
        self._settle()

    def trailing_at(self, step: int, pad_id: int) -> int:
        """The text id added at decode step `step` (the scheduler plans none past the text)."""
        i = step + 1
        if i < len(self.ids):
            return self.ids[i]
        if not self.done:
            raise RuntimeError(f"decode step {step} planned before its text arrived")
        return self.eos_id if i == len(self.ids) else pad_id

    def _settle(self) -> None:
        """Commit the tokens of the text after the committed part that more text cannot
        change. Only that tail is tokenized (a tokenizer splits words at a letter or digit
        followed by whitespace, so the tokens before such a point stay as they are), once
        more as a whole when the text ends, to check that."""
        tail = self.text[self.committed_chars :]
        body = tail if self.done else settled_text(tail)
        ids = self._tail_ids(body) if body.strip() or (self.done and body) else []
        if not self.done and ids != self._tail_ids(tail)[: len(ids)]:
            return  # the next characters may still join these tokens: wait for more text
        if self.done and self.ids + ids != self._encode(self.text):
            raise ValueError(
                "the text's tokens changed at an already spoken position; send text in whole words"
            )
        self.ids += ids
        self.committed_chars += len(body)

    def _tail_ids(self, tail: str) -> list[int]:
        """`tail`'s ids as they are in the whole text: encoded after the committed part's
        last character (a word's end, where the tokenizer splits), whose ids are dropped.
        Alone, a tail's leading newline would follow the chat frame's own and merge with it."""
        if self.committed_chars == 0:
            return self._encode(tail)
        anchor = self.text[self.committed_chars - 1]
        return self._encode(anchor + tail)[len(self._encode(anchor)) :]
