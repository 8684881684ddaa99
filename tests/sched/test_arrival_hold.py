"""`scheduler.arrival_hold_ms`: while streams run, a new request waits up to the hold to be
seated, so arrivals are prefilled together and the running streams keep their windows
(each one sized to end when the hold does) instead of a single admitting step per arrival.
With no stream running, at an unmeasured step time, or for a preempted request coming back,
nothing is held; admission control counts the hold in the expected first-audio wait; the
key without windows or the playback clock is refused."""

from __future__ import annotations

import time

import pytest

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.request import RequestState
from omniflow.errors import ConfigError
from omniflow.sched.ar import ARScheduler
from omniflow.sched.ar_admission import arrival_hold
from omniflow.sched.playback import PlaybackClock
from tests.sched.test_ar_scheduler import FakeRunner, req, sched

START = 100.0


def held_sched(hold_ms: float, now: list[float]) -> ARScheduler:
    clock = PlaybackClock(frame_s=0.08, margin_s=0.04, now=lambda: now[0])
    s = sched(clock, arrival_hold_ms=hold_ms)
    s.window_k = 8
    return s


def step(s: ARScheduler, runner: FakeRunner):
    plan = s.schedule()
    s.update(plan, runner.execute(plan))
    return plan


def seated(plan) -> set[str]:
    return {d.request_id for d in plan.new_requests}


def running_stream(hold_ms: float) -> tuple[ARScheduler, FakeRunner, list[float]]:
    """Stream a seated and playing with 10 frames in hand, 10 ms steps measured."""
    now = [START]
    s, runner = held_sched(hold_ms, now), FakeRunner()
    s.window_k = 0  # single steps to bring a along (the fake runner makes one token a step)
    s.add_request(req("a", max_new=60, ignore_eos=True))
    for _ in range(10):  # a's prefill and first frame, then nine more
        step(s, runner)
    s.window_k = 8
    s.playback.started["a"] = START + 0.5  # 10 frames made, the first due late: much slack
    s.playback.observe_step(0.01, steps=1, rows=1)
    return s, runner, now


def test_an_arrival_waits_out_the_hold_while_the_stream_runs_windows_ending_with_it():
    s, runner, now = running_stream(hold_ms=50)
    s.add_request(req("b"))
    assert not s.seats_free()  # the window in flight is not cut for it
    plan = s.schedule()
    assert list(plan.num_scheduled_tokens) == ["a"]  # b is held
    assert plan.window == {"a": 5}  # 50 ms of hold at 10 ms a step
    s.add_request(req("c"))  # a second arrival joins the first
    now[0] = START + 0.031  # 19 ms left: less than a window of two steps: both seated now
    plan = s.schedule()  # (a's window is still in flight)
    assert seated(plan) == {"b", "c"} and plan.window == {}
    assert s.window_stats.refusals["waiting"] == 0


def test_without_a_hold_the_arrival_is_seated_in_the_next_step():
    s, runner, _ = running_stream(hold_ms=0)
    s.add_request(req("b"))
    assert s.seats_free()
    plan = s.schedule()
    assert seated(plan) == {"b"} and plan.window == {}


def test_nothing_is_held_while_idle_or_before_a_step_is_measured():
    now = [START]
    s = held_sched(50, now)
    s.add_request(req("a"))
    assert seated(s.schedule()) == {"a"}  # no stream running: nothing to batch with
    s2 = held_sched(50, now)
    s2.window_k = 0
    runner = FakeRunner()
    s2.add_request(req("a", max_new=60, ignore_eos=True))
    step(s2, runner)
    s2.add_request(req("b"))  # a runs, but no step time is known yet
    assert seated(s2.schedule()) == {"b"}


def test_a_preempted_request_is_never_held():
    s, _, now = running_stream(hold_ms=50)
    back = req("back")
    back.state = RequestState.PREEMPTED
    queued = {"back": now[0]}
    assert arrival_hold([back], set(), queued, s.running, s.config, s.playback).steps is None
    fresh = req("fresh")
    hold = arrival_hold([fresh], set(), {"fresh": now[0]}, s.running, s.config, s.playback)
    assert hold.steps == 5


def test_admission_control_counts_the_hold_that_is_left():
    """The whole hold with no one held yet; beside an arrival held for 25 ms, its 25 ms
    left (they are seated together); nothing where nothing would be held."""
    held, _, now = running_stream(hold_ms=50)
    plain, _, _ = running_stream(hold_ms=0)
    base = plain.first_audio_wait_s()
    assert held.first_audio_wait_s() == pytest.approx(base + 0.05)
    held.add_request(req("b"))
    plain.add_request(req("b"))
    now[0] = START + 0.025
    assert held.first_audio_wait_s() == pytest.approx(plain.first_audio_wait_s() + 0.025)
    held.pause("a")
    plain.pause("a")
    assert held.first_audio_wait_s() == pytest.approx(plain.first_audio_wait_s())


def test_the_window_in_flight_is_cut_for_an_arrival_that_would_not_be_held():
    s, _, _ = running_stream(hold_ms=50)
    assert not s.seats_free()  # it would be held: the window goes on
    s.playback.step_s_by_rows.clear()  # no step time measured: nothing is held
    assert s.seats_free()


def test_a_hold_as_long_as_the_first_audio_limit_is_refused():
    key = "pipeline.stages.talker.scheduler.arrival_hold_ms"
    over = ["pipeline=qwen3_tts_fused", "platform=cpu", "pipeline.stages.talker.window_k=8"]
    spec = compose([*over, f"{key}=200", "server.max_first_audio_wait_s=0.2"])
    with pytest.raises(ConfigError) as refused:
        build_graph(spec)
    assert key in str(refused.value) and "server.max_first_audio_wait_s (0.2 s)" in str(
        refused.value
    )
    build_graph(compose([*over, f"{key}=200", "server.max_first_audio_wait_s=null"]))


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["pipeline.stages.talker.window_k=0"], "window_k >= 2 (resolved: 0)"),
        (
            ["pipeline.stages.talker.window_k=8", "pipeline.stages.talker.playback_margin_ms=null"],
            "playback_margin_ms",
        ),
    ],
)
def test_the_key_without_windows_or_the_clock_is_refused(overrides, words):
    key = "pipeline.stages.talker.scheduler.arrival_hold_ms"
    spec = compose(["pipeline=qwen3_tts_fused", "platform=cpu", f"{key}=50", *overrides])
    with pytest.raises(ConfigError) as refused:
        build_graph(spec)
    assert key in str(refused.value) and words in str(refused.value)
    ok = compose(
        [
            "pipeline=qwen3_tts_fused",
            "platform=cpu",
            f"{key}=50",
            "pipeline.stages.talker.window_k=8",
        ]
    )
    assert build_graph(ok).stages["talker"].scheduler.arrival_hold_ms == 50


def test_nothing_is_held_while_every_running_stream_is_paused():
    """A paused stream takes no step: no step would come to end the hold (the engine sleeps
    until a message), so the arrival is seated at once."""
    s, _, _ = running_stream(hold_ms=50)
    s.pause("a")
    s.add_request(req("b"))
    assert seated(s.schedule()) == {"b"}


def test_the_hold_counts_from_when_the_request_was_sent():
    """Sent 25 ms before the engine thread got to it (a window was running): 25 ms of its
    hold are left, two steps; sent 45 ms before, it is seated at once."""
    s, _, _ = running_stream(hold_ms=50)
    plain, _, _ = running_stream(hold_ms=0)
    s.add_request(req("b"), sent_at=time.monotonic() - 0.025)
    plain.add_request(req("b"))
    assert s.first_audio_wait_s() == pytest.approx(plain.first_audio_wait_s() + 0.025, abs=2e-3)
    plan = s.schedule()
    assert seated(plan) == set() and plan.window == {"a": 2}
    late, _, _ = running_stream(hold_ms=50)
    late.add_request(req("c"), sent_at=time.monotonic() - 0.045)
    assert seated(late.schedule()) == {"c"}


def test_with_no_one_waiting_windows_run_no_longer_than_the_hold():
    """A request sent during a window is taken in when the window ends: a window longer
    than the hold would hold it longer than the hold."""
    s, _, _ = running_stream(hold_ms=30)
    assert s.schedule().window == {"a": 3}  # slack allows 8; the hold 3 steps of 10 ms
    plain, _, _ = running_stream(hold_ms=0)
    assert plain.schedule().window == {"a": 8}


def test_a_hold_shorter_than_two_steps_holds_nothing_and_cuts_the_window():
    s, _, _ = running_stream(hold_ms=15)  # 1.5 steps of 10 ms
    assert s.seats_free()
    assert s.first_audio_wait_s() == pytest.approx(
        running_stream(hold_ms=0)[0].first_audio_wait_s()
    )
    s.add_request(req("b"))
    assert seated(s.schedule()) == {"b"}


def test_a_paused_waiting_request_neither_starts_nor_ends_a_hold():
    """p, sent 45 ms ago and paused, is not to be seated: b, sent now, is held its whole hold
    (p's nearly spent one does not seat b early), and with b alone waiting p changes nothing."""
    s, _, _ = running_stream(hold_ms=50)
    s.add_request(req("p"), sent_at=time.monotonic() - 0.045)
    s.pause("p")
    assert s.schedule().window == {"a": 5}  # none seatable: the cap of none waiting
    s2, _, _ = running_stream(hold_ms=50)
    s2.add_request(req("p"), sent_at=time.monotonic() - 0.045)
    s2.pause("p")
    s2.add_request(req("b"))
    plan = s2.schedule()
    assert seated(plan) == set() and plan.window == {"a": 5}
