"""The zero-buffer player (omniflow/core/player.py) against hand-made timelines: 0.1 s of
audio is 4,800 bytes (24 kHz s16le mono)."""

from __future__ import annotations

import pytest

from omniflow.core.player import BYTES_PER_SECOND, Stall, stalls

TENTH = BYTES_PER_SECOND // 10  # 0.1 s of audio


def approx(found: list[Stall]) -> list[tuple[float, float]]:
    return [(pytest.approx(s.at_s), pytest.approx(s.length_s)) for s in found]


def test_audio_that_comes_faster_than_it_plays_never_stalls():
    # 0.1 s every 0.05 s: the buffer grows
    assert stalls([0.0, 0.05, 0.10, 0.15], [TENTH] * 4) == []
    # each chunk exactly when the previous one has played: back to back, no gap
    assert stalls([2.0, 2.1, 2.2, 2.3], [TENTH] * 4) == []
    # one chunk, or none: nothing to wait for
    assert stalls([5.0], [10 * TENTH]) == [] and stalls([], []) == []


def test_one_stall_of_known_length():
    # playing from 1.0, 0.1 s runs out at 1.1; the next bytes come at 1.5
    found = stalls([1.0, 1.5], [TENTH, TENTH])
    assert approx(found) == [(1.1, 0.4)]


def test_several_stalls_each_with_its_length():
    # 0.0: 0.1 s (runs out at 0.1); 0.3: stall 0.2, plays to 0.4; 0.35: plays to 0.5;
    # 1.0: stall 0.5, plays to 1.1; 1.05: to 1.2; 1.3: stall 0.1
    times = [0.0, 0.3, 0.35, 1.0, 1.05, 1.3]
    found = stalls(times, [TENTH] * 6)
    assert approx(found) == [(0.1, 0.2), (0.5, 0.5), (1.2, 0.1)]
    assert sum(s.length_s for s in found) == pytest.approx(0.8)


def test_a_buffer_built_up_earlier_covers_a_later_gap():
    # 1 s arrives at once, then 0.1 s chunks 0.5 s apart: the second-long buffer drains by
    # 0.4 s a gap, and runs dry only at the third gap
    times = [0.0, 0.5, 1.0, 1.5, 2.0]
    found = stalls(times, [10 * TENTH, TENTH, TENTH, TENTH, TENTH])
    # runs out at 1.0 -> 1.1 (t=0.5) -> 1.2 (t=1.0) -> 1.5 arrives at 1.2: stall 0.3
    # -> plays to 1.6 -> 2.0: stall 0.4
    assert approx(found) == [(1.2, 0.3), (1.6, 0.4)]


def test_playback_starts_at_the_first_non_empty_bytes():
    # empty chunks (a stream's keep-alive or headers) neither start playback nor feed it
    found = stalls([0.0, 0.5, 0.6, 0.65, 1.0], [0, TENTH, 0, TENTH, TENTH])
    # starts at 0.5; runs out at 0.6, 0.65 brings more: stall 0.05; to 0.75; 1.0: stall 0.25
    assert approx(found) == [(0.6, 0.05), (0.75, 0.25)]


def test_bad_timelines_are_refused():
    with pytest.raises(ValueError, match="2 times against 1"):
        stalls([0.0, 1.0], [TENTH])
    with pytest.raises(ValueError, match="go back"):
        stalls([1.0, 0.5], [TENTH, TENTH])
