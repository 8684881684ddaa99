"""Benchmark prompt files: JSONL, one object a line, `{"text": str, "seconds": number}`
(`seconds`: how long a human reads it; other fields such as `id` are ignored; blank lines
are skipped). Read here once for every load generator, so that a bad file fails in one line
naming the file, the line and the field, before a model is built."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from omniflow.config.commands import BenchConfig
from omniflow.errors import ConfigError

DEFAULT_PROMPTS = Path(__file__).parent / "data" / "librispeech_pc_test_clean.jsonl"


class PromptFileError(ValueError):
    """A prompt file that cannot be read, or a line that is not a prompt."""


@dataclass(frozen=True)
class PromptRow:
    text: str
    seconds: float | None
    """None where the file gives none (only open-loop runs, at natural length, accept that)."""


def read_prompt_rows(
    path: str | Path, need_seconds: bool, limit: int | None = None
) -> list[PromptRow]:
    """The first `limit` prompts (all: None) of the file at `path`; every line up to there
    is checked. `need_seconds`: a row without a positive `seconds` is an error (fixed-length
    runs size each request from it)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise PromptFileError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise PromptFileError(f"{path} is a directory, not a JSONL prompt file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptFileError(f"{path}: cannot be read ({exc})") from None
    rows: list[PromptRow] = []
    for number, line in enumerate(lines, start=1):
        if limit is not None and len(rows) == limit:
            break
        if line.strip():
            rows.append(_row(line, f"{path}: line {number}", need_seconds))
    if not rows:
        raise PromptFileError(f"{path} holds no prompts (one JSON object a line: {_FORMAT})")
    return rows


_FORMAT = '{"text": "...", "seconds": 5.2}'


def _row(line: str, where: str, need_seconds: bool) -> PromptRow:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptFileError(f"{where}: not JSON ({exc.msg}); each line is {_FORMAT}") from None
    if not isinstance(row, dict):
        raise PromptFileError(f"{where}: a JSON object is expected, e.g. {_FORMAT}")
    text = row.get("text")
    if not isinstance(text, str) or not text.strip():
        raise PromptFileError(f"{where}: 'text' must be a non-empty string")
    seconds = row.get("seconds")
    if seconds is None and not need_seconds:
        return PromptRow(text, None)
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        what = "missing" if seconds is None else f"{seconds!r}"
        raise PromptFileError(
            f"{where}: 'seconds' must be a positive number ({what}); fixed-length requests "
            "(a closed loop's, the warm-ups) are sized from it"
        )
    return PromptRow(text, float(seconds))


def check_bench_prompts(bench: BenchConfig) -> list[PromptRow]:
    """The prompts a bench job reads (`bench.prompts`, else the shipped set), checked before
    anything is built: closed-loop jobs size requests by `seconds` and need a whole round's
    prompts; open-loop requests take only the text, and their warm-ups (fixed-length, the
    first `bench.warmup` lines) `seconds`. A problem is a `ConfigError` on `bench.prompts`
    (or on the key that asked for more prompts than the file holds)."""
    path = bench.prompts or DEFAULT_PROMPTS
    closed = bench.rps is None
    try:
        if closed:
            rows = read_prompt_rows(path, need_seconds=True, limit=bench.round_prompts)
        else:
            rows = read_prompt_rows(path, need_seconds=False)
            if bench.warmup:
                read_prompt_rows(path, need_seconds=True, limit=bench.warmup)
    except PromptFileError as exc:
        raise ConfigError("bench.prompts", str(exc)) from None
    if closed and len(rows) < bench.round_prompts:  # never a silently smaller round
        key = (
            "bench.prompts_per_lane"
            if bench.round_prompts > bench.num_prompts
            else "bench.num_prompts"
        )
        raise ConfigError(
            key, f"a round needs {bench.round_prompts} prompts and {path} holds {len(rows)}"
        )
    return rows
