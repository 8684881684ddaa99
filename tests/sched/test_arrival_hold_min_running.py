"""`scheduler.arrival_hold_min_running`: the hold acts only while at least that many streams
take steps (near a full batch); below it an arrival is seated at the next step, the window
in flight is cut for it and admission control adds no hold. The key without a hold, or
above the streams the stage can hold, is refused."""

from __future__ import annotations

import pytest

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.errors import ConfigError
from omniflow.sched.ar import ARScheduler
from omniflow.sched.playback import PlaybackClock
from tests.sched.test_ar_scheduler import FakeRunner, req, sched
from tests.sched.test_arrival_hold import START, seated, step

KEY = "pipeline.stages.talker.scheduler.arrival_hold_min_running"


def streams(min_running: int, count: int = 2) -> tuple[ARScheduler, list[float]]:
    """`count` streams seated and playing with frames in hand, 10 ms steps measured, a 50 ms
    hold held from `min_running` running streams."""
    now = [START]
    clock = PlaybackClock(frame_s=0.08, margin_s=0.04, now=lambda: now[0])
    s = sched(clock, arrival_hold_ms=50, arrival_hold_min_running=min_running)
    runner = FakeRunner()
    for i in range(count):
        s.add_request(req(f"s{i}", max_new=60, ignore_eos=True))
    for _ in range(10):  # single steps: the prefills and first frames, then more
        step(s, runner)
    s.window_k = 8
    for i in range(count):
        s.playback.started[f"s{i}"] = START + 0.5  # much slack
    s.playback.observe_step(0.01, steps=1, rows=count)
    return s, now


def test_at_the_running_streams_named_an_arrival_is_held():
    s, _ = streams(min_running=2)
    s.add_request(req("b"))
    assert not s.seats_free()
    plan = s.schedule()
    assert "b" not in seated(plan) and plan.window  # held; the streams run a window


def test_below_them_an_arrival_is_seated_at_once_and_no_hold_is_counted():
    s, _ = streams(min_running=3)
    plain, _ = streams(min_running=1)
    plain.config = plain.config.model_copy(update={"arrival_hold_ms": 0})
    assert s.first_audio_wait_s() == pytest.approx(plain.first_audio_wait_s())
    s.add_request(req("b"))
    assert s.seats_free()  # the window in flight is cut for it
    assert seated(s.schedule()) == {"b"}


def test_a_paused_stream_does_not_count_toward_them():
    s, _ = streams(min_running=2)
    s.pause("s1")  # its consumer is behind: it takes no step
    s.add_request(req("b"))
    assert s.seats_free()
    assert seated(s.schedule()) == {"b"}


def test_a_held_arrival_goes_in_once_the_running_streams_fall_below_them():
    s, _ = streams(min_running=2)
    s.add_request(req("b"))
    assert "b" not in seated(s.schedule())
    s.finish("s1", "abort")  # one stream left: below the two named
    assert seated(s.schedule()) == {"b"}


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ([f"{KEY}=4"], "with arrival_hold_ms 0 nothing is held"),
        (
            [f"{KEY}=32", "pipeline.stages.talker.scheduler.arrival_hold_ms=50"],
            "32 is not below the streams the stage holds (32",
        ),
    ],
)
def test_the_key_without_a_hold_or_above_the_seats_is_refused(overrides, words):
    base = ["pipeline=qwen3_tts_fused", "platform=cpu", "pipeline.stages.talker.window_k=8"]
    with pytest.raises(ConfigError) as refused:
        build_graph(compose([*base, *overrides]))
    assert KEY in str(refused.value) and words in str(refused.value), str(refused.value)
    resident = "pipeline.stages.talker.scheduler.max_resident_seqs=40"  # more held than rows
    held = [f"{KEY}=39", "pipeline.stages.talker.scheduler.arrival_hold_ms=50", resident]
    assert (
        build_graph(compose([*base, *held])).stages["talker"].scheduler.arrival_hold_min_running
        == 39
    )
