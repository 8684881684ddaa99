"""Text arriving in pieces, cut into sentences as soon as each is known to be complete.

The WebSocket endpoint (serve/ws.py, docs/websocket.md) speaks one sentence per request, so
it must know where a sentence ends while the rest of the text is still being written:

- `.`, `!`, `?` (runs of them, `...`, `?!`) end a sentence once whitespace follows them,
  closing quotes and brackets after them included (`He said "no."` ends after the quote).
  Whitespace must follow because the next piece may continue the word: `3.` then `14`,
  `e.g` then `.`; a terminator at the end of the text received so far waits for the next
  piece (or for `flush`).
- CJK `。`, `！`, `？` (and the full-width `．`) end a sentence at once, with any closing
  quotes or brackets already received after them; no whitespace follows them in CJK text.
- `flush` (the client's `input.done`) hands out what is left, whatever its ending.

Abbreviations (`Mr. Smith`) end a sentence early: the two halves are spoken as two requests,
which costs a short pause, not a word.
"""

from __future__ import annotations

import re

CLOSERS = "\"'”’)]}」』）】》"
_BOUNDARY = re.compile(rf"[.!?]+[{re.escape(CLOSERS)}]*(?=\s)|[。！？．]+[{re.escape(CLOSERS)}]*")


class SentenceBuffer:
    """Text pieces in (`feed`), complete sentences out, stripped of surrounding whitespace;
    `flush` ends the text and returns the rest."""

    def __init__(self) -> None:
        self._text = ""

    def __len__(self) -> int:
        return len(self._text)

    def feed(self, piece: str) -> list[str]:
        """Append `piece`; the sentences it completed, in order (possibly none)."""
        self._text += piece
        sentences: list[str] = []
        start = 0
        for match in _BOUNDARY.finditer(self._text):
            sentence = self._text[start : match.end()].strip()
            if sentence:
                sentences.append(sentence)
            start = match.end()
        self._text = self._text[start:]
        return sentences

    def flush(self) -> str | None:
        """What is left (None: nothing but whitespace), and an empty buffer."""
        rest, self._text = self._text.strip(), ""
        return rest or None

    def clear(self) -> None:
        self._text = ""
