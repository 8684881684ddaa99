"""What text a request may carry: printable characters, and something visible to speak.

JSON lets a client send any code point, NUL and lone surrogates (`\\ud800`) included. None of
those is speech, and each is a hazard further on (a C string cut short, a tokenizer or a log
writer that cannot encode it), so they are refused here with a 400 naming the field instead of
failing later as a 500 or producing audio for text nobody can see. Tab, newline and carriage
return are ordinary text. Text made only of whitespace and invisible format characters
(zero-width space and joiners, word joiner, BOM: Unicode category Cf) has nothing to speak.
"""

from __future__ import annotations

import unicodedata

from omniflow.serve.errors import ApiError

ALLOWED_CONTROLS = frozenset("\t\n\r")


def check_printable(text: str, field: str) -> None:
    """400 naming `field` at the first control character or lone surrogate in `text`."""
    for index, ch in enumerate(text):
        category = unicodedata.category(ch)
        if category == "Cc" and ch not in ALLOWED_CONTROLS:
            what = "control character"
        elif category == "Cs":
            what = "lone surrogate"
        else:
            continue
        raise ApiError(
            400,
            f"{field} contains {what} U+{ord(ch):04X} at index {index}; "
            "only printable text, tab, newline and carriage return are accepted",
            field,
        )


BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
"""Characters of a letter or symbol category that draw nothing: the Hangul fillers and the
blank braille pattern (used to pass "not empty" checks)."""
INVISIBLE_CATEGORIES = frozenset({"Cf", "Mn", "Me"})
"""Format characters (zero-width space, joiners, marks of direction) and combining marks,
which have nothing to speak without a letter to sit on."""


def has_visible(text: str) -> bool:
    """Whether `text` has a character to speak: not whitespace, not a format character or
    a lone combining mark, not a blank letter."""
    return any(
        not ch.isspace()
        and ch not in BLANK_LETTERS
        and unicodedata.category(ch) not in INVISIBLE_CATEGORIES
        for ch in text
    )


def check_speakable(text: str, field: str) -> None:
    """`check_printable`, then a 400 when nothing visible is left to speak."""
    check_printable(text, field)
    if not has_visible(text):
        raise ApiError(
            400,
            f"{field} is empty: it has no visible characters (only whitespace, "
            "zero-width/format characters, combining marks or blank letters)",
            field,
        )
