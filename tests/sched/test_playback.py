"""Each stream's playback clock and the window length its slack allows (`sched/playback.py`),
against hand-worked cases; end to end, slack-sized windows keep the single-step codes."""

from __future__ import annotations

import itertools

import pytest
import torch

from omniflow.sched.playback import PlaybackClock
from tests.factories import talker_engine
from tests.stages.test_talker_engine import collect, fixed

T = "pipeline.stages.talker"


def clock(**kw) -> PlaybackClock:
    return PlaybackClock(frame_s=0.08, margin_s=0.04, **kw)


def test_slack_is_the_next_frames_deadline_minus_now():
    c = clock()
    c.frames_made("a", 0, at=10.0)  # its first frame starts the clock
    c.frames_made("a", 3, at=10.1)  # later frames do not move it
    # frame 5 is due by 10.0 + 5 * 0.08 - 0.04 = 10.36; at 10.2 that leaves 0.16 s
    assert c.slack("a", 5, at=10.2) == pytest.approx(0.16)
    assert c.slack("b", 0, at=10.2) is None  # no first frame yet: no deadline
    c.forget("a")
    assert c.slack("a", 5, at=10.2) is None


def test_window_length_follows_the_tightest_slack():
    c = clock()
    assert c.window_steps(8, [("new", 0)], at=0.0) == 1  # nothing measured, a fresh stream
    c.frames_made("s", 0, at=0.0)
    assert c.window_steps(8, [("s", 1)], at=0.0) == 8  # nothing measured: the cap
    c.forget("s")
    c.observe_step(0.09, steps=3)  # 30 ms a step
    c.frames_made("a", 0, at=10.0)
    c.frames_made("b", 0, at=10.0)
    # a: 0.16 s of slack -> 5 steps of 30 ms; b: 10.0 + 20 * 0.08 - 0.04 - 10.2 = 1.36 s
    assert c.window_steps(8, [("a", 5), ("b", 20)], at=10.2) == 5
    assert c.window_steps(4, [("a", 5), ("b", 20)], at=10.2) == 4  # window_k caps it
    assert c.window_steps(8, [("b", 20)], at=10.2) == 8
    assert c.window_steps(8, [("a", 1)], at=10.2) == 1  # late already: single steps
    # first frame in flight: it plays from about now with 80 ms, 40 ms of slack -> 1 step
    assert c.window_steps(8, [("new", 0)], at=10.2) == 1
    assert c.window_steps(8, [("new", 0), ("b", 20)], at=10.2) == 1
    c.observe_step(0.005 * 3, steps=3)  # 30 ms * 0.8 + 5 ms * 0.2 = 25 ms a step
    assert c.window_steps(8, [("new", 0)], at=10.2) == 1
    fast = clock()
    fast.observe_step(0.004, steps=1)  # 4 ms a step: 40 ms of slack holds 10, capped at 8
    assert fast.window_steps(8, [("new", 0)], at=10.2) == 8
    assert fast.window_steps(8, [("new", 0)], at=99.0) == 8  # no clock: `at` does not age it


def test_with_audio_in_chunks_the_first_chunk_sizes_the_window():
    c = clock(chunk_steps=2)
    c.observe_step(0.09, steps=3)  # 30 ms a step
    c.frames_made("a", 0, at=10.0)
    c.frames_made("b", 0, at=10.0)
    # a: 10.0 + 2 * 0.08 - 0.04 - 10.02 = 0.1 s -> 3 steps: the first chunk's 2 fit, and
    # each chunk brings 160 ms of audio for 60 ms of steps: the whole window
    assert c.window_steps(8, [("a", 2), ("b", 20)], at=10.02) == 8
    # b alone: 1.36 s at 10.2 -> the cap either way
    assert c.window_steps(8, [("b", 20)], at=10.2) == 8
    # a: 10.0 + 0.08 - 0.04 - 10.0 = 40 ms -> 1 step: not the first chunk, a window of 1
    assert c.window_steps(8, [("a", 1)], at=10.0) == 1
    # a chunk as long as the window is its end: sized by slack as without chunks
    whole = clock(chunk_steps=8)
    whole.observe_step(0.09, steps=3)
    whole.frames_made("a", 0, at=10.0)
    assert whole.window_steps(8, [("a", 2), ("b", 20)], at=10.02) == 3
    # a step longer than a frame: a chunk brings less audio than its steps take
    slow = clock(chunk_steps=2)
    slow.observe_step(0.1, steps=1)
    slow.frames_made("a", 0, at=0.0)
    # a: 0.0 + 4 * 0.08 - 0.04 - 0.0 = 0.28 s -> 2 steps: the first chunk fits, not the rest
    assert slow.window_steps(8, [("a", 4)], at=0.0) == 2


def test_step_time_is_a_running_estimate():
    c = clock()
    c.observe_step(0.08, steps=8)
    assert c.step_s == pytest.approx(0.01)
    c.observe_step(0.02, steps=1)
    assert c.step_s == pytest.approx(0.8 * 0.01 + 0.2 * 0.02)
    c.observe_step(0.0, steps=1)  # nothing measured: ignored
    assert c.step_s == pytest.approx(0.012)


def slack_engine(tick_s: float, **kw):
    """A talker engine whose scheduler sizes windows by slack on a fake clock that moves
    `tick_s` at every reading."""
    engine, proc = talker_engine(window_k=8, **kw)
    ticks = itertools.count()
    engine.scheduler.playback = clock(now=lambda: next(ticks) * tick_s)
    return engine, proc


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_slack_sized_windows_keep_the_single_step_codes(async_scheduling):
    reqs = [fixed(f"r{i}", 19, seed=i, text=f"Same length {i}.") for i in range(3)]
    base_engine, proc = talker_engine(async_scheduling=async_scheduling)
    for r in reqs:
        base_engine.add_request(proc.make_request(r))
    base = collect(base_engine.run_until_idle())
    # each clock reading 30 ms later: streams are always short of slack, windows stay short
    engine, proc = slack_engine(0.03, async_scheduling=async_scheduling)
    for r in reqs:
        engine.add_request(proc.make_request(r))
    assert collect(engine.run_until_idle()) == base
    stats = engine.scheduler.window_stats
    assert stats.refusals["slack"] > 0 or stats.executed_steps < 8 * stats.executed_windows
    assert engine.scheduler.playback.started == {}  # finished streams forgotten


def test_a_tight_stream_shortens_the_window_and_a_relaxed_one_gets_the_cap():
    tight, proc = slack_engine(0.02)  # 20 ms per reading: slack grows slowly
    tight.add_request(proc.make_request(fixed("a", 40, seed=2)))
    tight.run_until_idle()
    relaxed, proc = slack_engine(0.0005)  # the clock barely moves: slack grows 80 ms a frame
    relaxed.add_request(proc.make_request(fixed("a", 40, seed=2)))
    relaxed.run_until_idle()
    t, r = tight.scheduler.window_stats, relaxed.scheduler.window_stats
    assert r.executed_steps / max(1, r.executed_windows) > t.executed_steps / max(
        1, t.executed_windows
    )
    assert r.refusals["slack"] == 0 and t.refusals["slack"] > 0


def test_the_planned_window_is_as_long_as_the_slack_allows():
    engine, proc = talker_engine(window_k=8)
    now = [100.0]
    engine.scheduler.playback = clock(now=lambda: now[0])
    engine.add_request(proc.make_request(fixed("a", 40, seed=2)))
    engine.step()  # the prefill makes frame 1 at t=100.0
    engine.scheduler.playback.step_s = 0.03
    # frame 1 is due by 100.0 + 0.08 - 0.04; at 99.9 there are 0.14 s: 4 steps of 30 ms
    now[0] = 99.9
    assert engine.stats().min_slack_s == pytest.approx(0.14)  # on /metrics, the least
    assert engine.scheduler.schedule().window == {"a": 4}
    assert engine.scheduler.gauges().windows.sizes == {4: 1}  # on /metrics by length


def test_the_window_planned_behind_a_prefill_in_flight_is_sized_for_a_fresh_stream():
    # async scheduling plans the next step before the prefill's frame is in: that stream
    # plays from about then with one frame (80 ms), 40 ms of slack -> 4 steps of 10 ms
    engine, proc = talker_engine(window_k=8, async_scheduling=True)
    engine.scheduler.playback = clock(now=lambda: 100.0)
    engine.scheduler.playback.step_s = 0.01
    engine.add_request(proc.make_request(fixed("a", 40, seed=2)))
    assert engine.scheduler.schedule().window == {}  # the prefill
    assert engine.scheduler.schedule().window == {"a": 4}


@pytest.mark.parametrize(
    ("overrides", "margin"),
    [
        (["pipeline.stages.talker.window_k=8"], 0.04),
        (
            ["pipeline.stages.talker.window_k=8", "pipeline.stages.talker.playback_margin_ms=25"],
            0.025,
        ),
        (
            ["pipeline.stages.talker.window_k=8", "pipeline.stages.talker.playback_margin_ms=null"],
            None,
        ),
        # no windows, but the talker decodes its own audio: admission and seating use it
        (["pipeline.stages.talker.window_k=0"], 0.04),
        (
            ["pipeline.stages.talker.window_k=0", "pipeline.stages.talker.playback_margin_ms=null"],
            None,
        ),
    ],
)
def test_the_margin_key_gives_the_talker_its_clock(overrides, margin):
    from omniflow.build.context import BuildContext
    from omniflow.build.qwen3_tts import playback_clock
    from omniflow.config.compose import compose
    from omniflow.config.resolve import build_graph

    graph = build_graph(compose(["pipeline=qwen3_tts_fused", "platform=cpu", *overrides]))
    ctx = BuildContext(graph, torch.device("cpu"), torch.float32)
    got = playback_clock(graph.stages["talker"], ctx)
    assert (got and got.margin_s) == margin
    if got is not None:
        assert got.frame_s == pytest.approx(0.08)  # 1920 samples at 24 kHz


def test_a_talker_without_windows_or_audio_of_its_own_has_no_clock():
    """The two-stage talker's frames go to code2wav: without windows it keeps no playback."""
    from omniflow.config.compose import compose
    from omniflow.config.resolve import build_graph

    two = build_graph(compose(["pipeline=qwen3_tts", "platform=cpu"]))
    assert two.stages["talker"].window_k == 0
    assert two.stages["talker"].playback_margin_ms is None
