"""Text tokenizers: byte-level for dummy weights, the checkpoint's Qwen2 BPE for real ones.

Both encode the CustomVoice chat string `<|im_start|>assistant\\n{text}<|im_end|>\\n
<|im_start|>assistant\\n` so that the first 3 ids are the role and the last 5 the suffix,
which is the layout the prompt builder relies on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from omniflow.models.qwen3_tts.vocab import TextSpecials

CHAT = "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
INSTRUCT = "<|im_start|>user\n{text}<|im_end|>\n"
ROLE_LEN = 3
SUFFIX_LEN = 5

# The Qwen2 pre-tokenizer split pattern (public, part of the tokenizer's definition).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class TextTokenizer(Protocol):
    specials: TextSpecials

    def encode_chat(self, text: str) -> list[int]:
        """Ids of the chat string around `text`."""
        ...

    def encode_instruct(self, text: str) -> list[int]:
        """Ids of the user turn carrying a style instruction."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 plus the special tokens above them (dummy models)."""

    VOCAB = 262

    def __init__(self) -> None:
        self.specials = TextSpecials(
            im_start=256,
            im_end=257,
            assistant=258,
            newline=10,
            tts_pad=259,
            tts_bos=260,
            tts_eos=261,
        )

    def encode_chat(self, text: str) -> list[int]:
        s = self.specials
        role = [s.im_start, s.assistant, s.newline]
        suffix = [s.im_end, s.newline, s.im_start, s.assistant, s.newline]
        return role + list(text.encode("utf-8")) + suffix

    def encode_instruct(self, text: str) -> list[int]:
        s = self.specials
        body = list(f"user\n{text}".encode())
        return [s.im_start, *body, s.im_end, s.newline]


class BPETokenizer:
    """The checkpoint's byte-level BPE through the `tokenizers` library."""

    def __init__(self, directory: str | Path, tts_ids: tuple[int, int, int]) -> None:
        from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

        d = Path(directory)
        if (d / "tokenizer.json").is_file():
            self._tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        elif (d / "vocab.json").is_file() and (d / "merges.txt").is_file():
            tok = Tokenizer(models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt")))
            tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
            tok.decoder = decoders.ByteLevel()
            tok.add_special_tokens(_special_tokens(d))
            self._tok = tok
        else:
            raise FileNotFoundError(
                f"{d}: no tokenizer.json, nor vocab.json + merges.txt, for the BPE tokenizer"
            )
        ids = {t: self._tok.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>")}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"{d}: tokenizer lacks special tokens {missing}")
        assistant = self._tok.encode("assistant", add_special_tokens=False).ids
        newline = self._tok.encode("\n", add_special_tokens=False).ids
        if len(assistant) != 1 or len(newline) != 1:
            raise ValueError(f"{d}: 'assistant' and '\\n' must be single tokens")
        self.specials = TextSpecials(
            im_start=ids["<|im_start|>"],
            im_end=ids["<|im_end|>"],
            assistant=assistant[0],
            newline=newline[0],
            tts_pad=tts_ids[0],
            tts_bos=tts_ids[1],
            tts_eos=tts_ids[2],
        )

    def encode_chat(self, text: str) -> list[int]:
        return self._tok.encode(CHAT.format(text=text), add_special_tokens=False).ids

    def encode_instruct(self, text: str) -> list[int]:
        return self._tok.encode(INSTRUCT.format(text=text), add_special_tokens=False).ids


def _special_tokens(d: Path) -> list[str]:
    """Special tokens named by tokenizer_config.json (Qwen2 keeps them out of vocab.json)."""
    cfg = d / "tokenizer_config.json"
    names = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}
    if cfg.is_file():
        data = json.loads(cfg.read_text())
        for entry in data.get("added_tokens_decoder", {}).values():
            names.add(entry["content"])
    return sorted(names)
