"""A zero-buffer player over a stream's arrival timeline: where playback would have stalled.

The player starts playing at the first audio bytes and plays each byte as soon as it has it,
at the stream's byte rate (24 kHz s16le mono: 48,000 bytes a second). The bytes received by
time t must cover the audio played by t; when they do not, playback stops (a stall) until the
next bytes arrive, and resumes from there. The end of the stream is not a stall.

A pure function of the timeline, so it is tested against hand-made timelines
(tests/bench/test_open_loop_player.py) and used by the open-loop load generator
(omniflow/bench/open_client.py) on each request's real one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BYTES_PER_SECOND = 2 * 24000
"""24 kHz, 16-bit mono PCM."""


@dataclass(frozen=True)
class Stall:
    """Playback stopped at `at_s` (on the timeline's clock) for `length_s` seconds."""

    at_s: float
    length_s: float


def stalls(
    times_s: Sequence[float],
    byte_counts: Sequence[int],
    bytes_per_second: float = BYTES_PER_SECOND,
) -> list[Stall]:
    """Every stall of a zero-buffer player fed `byte_counts[i]` bytes at `times_s[i]`.

    Times are in seconds on any clock, in order of arrival; empty chunks are skipped (the
    player starts at the first non-empty one)."""
    if len(times_s) != len(byte_counts):
        raise ValueError(f"{len(times_s)} times against {len(byte_counts)} byte counts")
    out: list[Stall] = []
    runs_out: float | None = None  # when the audio received so far has all been played
    last = float("-inf")
    for t, n in zip(times_s, byte_counts, strict=True):
        if t < last:
            raise ValueError(f"arrival times go back: {t} after {last}")
        last = t
        if n < 0:
            raise ValueError(f"negative byte count {n} at {t}")
        if n == 0:
            continue
        if runs_out is None:  # first audio: playback starts now
            runs_out = t
        elif t > runs_out:  # the player ran dry at runs_out and waited until now
            out.append(Stall(runs_out, t - runs_out))
            runs_out = t
        runs_out += n / bytes_per_second
    return out
