"""A zero-buffer player over a stream's arrival timeline: where playback would have stalled.

The player starts playing at the first audio bytes and plays each byte as soon as it has it,
at the stream's byte rate (24 kHz s16le mono: 48,000 bytes a second). The bytes received by
time t must cover the audio played by t; when they do not, playback stops (a stall) until the
next bytes arrive, and resumes from there. The end of the stream is not a stall.

The open-loop load generator (`bench/open_client.py`) runs it over each request's arrival
timeline (`stalls`, a pure function tested against hand-made timelines); the server feeds
one per streamed response as it sends audio (`ZeroBufferPlayer`), counting the stalls it
can see on /metrics.
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


class ZeroBufferPlayer:
    """The player fed one chunk at a time: `feed` answers the stall the chunk ends, if any."""

    def __init__(self) -> None:
        self.runs_out: float | None = None
        """When the audio received so far has all been played (None: nothing yet)."""
        self._last = float("-inf")

    def feed(self, t: float, seconds: float) -> Stall | None:
        if t < self._last:
            raise ValueError(f"arrival times go back: {t} after {self._last}")
        self._last = t
        if seconds < 0:
            raise ValueError(f"negative audio length {seconds} at {t}")
        if seconds == 0:
            return None
        stall = None
        if self.runs_out is None:  # first audio: playback starts now
            self.runs_out = t
        elif t > self.runs_out:  # the player ran dry at runs_out and waited until now
            stall = Stall(self.runs_out, t - self.runs_out)
            self.runs_out = t
        self.runs_out += seconds
        return stall


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
    player = ZeroBufferPlayer()
    found = (
        player.feed(t, n / bytes_per_second) for t, n in zip(times_s, byte_counts, strict=True)
    )
    return [s for s in found if s is not None]
