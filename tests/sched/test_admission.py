"""How long a new request would wait for a seat (`sched/ar_admission.py`), from the measured
interval between seats freeing, and the orchestrator's refusal when that is too long."""

from __future__ import annotations

import pytest

from omniflow.config.schema import SchedulerConfig
from omniflow.core.pipeline import Overloaded, RequestLimits
from omniflow.sched.ar import ARScheduler
from omniflow.sched.ar_admission import SeatGaps
from tests.factories import Collector, build, speech
from tests.sched.test_ar_scheduler import req


def test_seat_gaps_hand_worked():
    now = [0.0]
    gaps = SeatGaps(lambda: now[0])
    assert gaps.wait_s(0) == 0.0 and gaps.wait_s(3) is None  # nothing measured yet
    gaps.freed()
    now[0] = 2.0
    gaps.freed()  # one gap of 2 s
    assert gaps.wait_s(3) == pytest.approx(6.0)
    now[0] = 3.0
    gaps.freed()  # a gap of 1 s: 0.9 * 2 + 0.1 * 1
    assert gaps.interval_s == pytest.approx(1.9)


def test_the_scheduler_counts_the_queue_ahead_and_free_seats():
    now = [0.0]
    cfg = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=64)
    s = ARScheduler(cfg, clock=lambda: now[0])
    assert s.first_audio_wait_s() == 0.0  # a seat is free
    for i in range(5):
        s.add_request(req(f"r{i}", prompt_len=4, max_new=50))
    s.schedule()  # r0 and r1 seated, three wait
    assert s.first_audio_wait_s() is None  # no seat has freed yet
    s.finish("r0", "abort")
    now[0] = 0.5
    s.finish("r1", "abort")  # seats free every 0.5 s
    s.schedule()  # r2 and r3 seated, r4 waits
    # a new request has r4 ahead of it and no free seat: two seats to free, 0.5 s each
    assert s.first_audio_wait_s() == pytest.approx(1.0)
    s.finish("r4", "abort")  # a waiting request leaving frees no seat
    assert s.seats.interval_s == pytest.approx(0.5)


def test_the_orchestrator_refuses_what_would_wait_past_the_limit():
    orch = build("qwen3_tts_fused")
    try:
        source = orch.engines[0]
        source.scheduler.first_audio_wait_s = lambda: 3.0  # type: ignore[method-assign]
        with pytest.raises(Overloaded) as err:
            orch.submit(
                speech("late", max_new_tokens=3), Collector(), RequestLimits(max_wait_s=1.0)
            )
        assert err.value.retry_after_s == 3.0
        assert orch.num_live == 0  # nothing was queued
        done = [Collector(), Collector()]
        orch.submit(speech("patient", max_new_tokens=3), done[0])  # no limit
        orch.submit(speech("fits", max_new_tokens=3), done[1], RequestLimits(max_wait_s=5.0))
        for c in done:
            c.wait()
            assert c.events[-1].finish_reason in ("stop", "length")
    finally:
        orch.stop()


def test_a_stage_slower_than_real_time_with_a_late_stream_waits_by_its_lateness():
    """Admission also guards the running streams: while a step takes longer than the audio
    it makes and a stream is late, a new request would wait (be refused) by that much."""
    from omniflow.sched.playback import PlaybackClock

    now = [10.0]
    clock = PlaybackClock(frame_s=0.08, margin_s=0.04, now=lambda: now[0])
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, num_kv_blocks=64)
    s = ARScheduler(cfg, window_k=8, playback=clock)
    s.add_request(req("a", prompt_len=4, max_new=50))
    s.schedule()
    clock.frames_made("a", 0, at=10.0)
    s.requests["a"].output_tokens.extend([1, 2])  # two frames made: due by 10.12
    now[0] = 10.5  # 0.38 s late
    clock.step_s = 0.05  # faster than real time: it catches up by itself
    # a seat is free, nobody is pushed: the step in flight and its own, 50 ms each
    assert s.first_audio_wait_s() == pytest.approx(0.1)
    clock.step_s = 0.1  # slower than real time
    assert s.first_audio_wait_s() == pytest.approx(0.38)


def test_one_more_stream_must_keep_time():
    """`keeps_time`: streams, `rows` a step, each needing a frame per 80 ms of playback, of
    which 80 % (`ROTATION_LOAD`) may go to steps: 64 ms."""
    from omniflow.sched.ar_admission import keeps_time
    from omniflow.sched.playback import PlaybackClock

    clock = PlaybackClock(frame_s=0.08, margin_s=0.04)
    assert keeps_time(clock, 3, rows=4)  # nothing measured: no telling
    clock.observe_step(0.2, steps=1, rows=4)  # a first step (a prefill, first launches)
    assert keeps_time(clock, 3, rows=4)  # one step is not yet a measure
    for _ in range(30):
        clock.observe_step(0.05, steps=1, rows=4)
    assert keeps_time(clock, 3, rows=4)  # 50 ms steps, once settled
    assert not keeps_time(clock, 6, rows=4)  # two turns of 50 ms: 100 ms
    for _ in range(20):
        clock.observe_step(0.06, steps=1, rows=4)
    assert keeps_time(clock, 3, rows=4)  # 60 ms a frame
    for _ in range(20):
        clock.observe_step(0.07, steps=1, rows=4)
    assert not keeps_time(clock, 3, rows=4)  # 70 ms a frame: no reserve left
    # 5 to 8 streams a step, never measured: at least what 3 or 4 take, already too long
    assert not keeps_time(clock, 6, rows=8)
    clock.observe_step(0.01, steps=1, rows=8)  # one result of 8 rows does not settle it
    assert not keeps_time(clock, 6, rows=8)


def test_a_free_seat_that_would_make_every_stream_late_is_not_free():
    """On a stage whose measured step for one more row is slower than the audio it makes, a
    free seat does not count: the request waits for a stream to leave (the seat interval),
    then for the step in flight and its own."""
    from omniflow.sched.playback import PlaybackClock

    now = [0.0]
    clock = PlaybackClock(frame_s=0.08, margin_s=0.04, now=lambda: now[0])
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, num_kv_blocks=64)
    s = ARScheduler(cfg, playback=clock, clock=lambda: now[0])
    for i in range(3):
        s.add_request(req(f"r{i}", prompt_len=4, max_new=50))
    s.schedule()  # three running, one seat free
    for _ in range(4):
        clock.observe_step(0.03, steps=1, rows=4)
    assert s.first_audio_wait_s() == pytest.approx(0.06)  # seated now: two 30 ms steps
    for _ in range(20):
        clock.observe_step(0.1, steps=1, rows=4)  # 100 ms a frame: slower than its audio
    assert s.first_audio_wait_s() is None  # no seat has freed yet: no telling how long
    s.finish("r0", "abort")
    now[0] = 2.0
    s.add_request(req("r3", prompt_len=4, max_new=50))
    s.schedule()
    s.finish("r1", "abort")  # seats free every 2 s
    # r2, r3 run, two seats free; but at 100 ms a step one more stream is one too many
    assert s.first_audio_wait_s() == pytest.approx(2.0 + 2 * 0.1, rel=1e-3)


def test_an_idle_stage_never_refuses():
    """Nothing running and nothing queued: no step in flight and no one to wait for, however
    slow the steps it measured before (a refusal would never end: nothing would run to
    measure them again)."""
    from omniflow.sched.playback import PlaybackClock

    now = [0.0]
    clock = PlaybackClock(frame_s=0.08, margin_s=0.04, now=lambda: now[0])
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, num_kv_blocks=64)
    s = ARScheduler(cfg, playback=clock, clock=lambda: now[0])
    for _ in range(10):
        clock.observe_step(0.5, steps=1, rows=1)  # slower than its audio
    s.seats.freed()
    now[0] = 1.0
    s.seats.freed()  # a seat frees every second
    assert s.first_audio_wait_s() == 0.0
    s.add_request(req("r0", prompt_len=4, max_new=50))
    s.schedule()  # one running: the next request waits for a stream to leave, then 2 steps
    assert s.first_audio_wait_s() == pytest.approx(1.0 + 2 * 0.5)


def test_seat_gaps_span_only_a_contended_spell():
    """An idle spell between frees is not seat turnover: the reference is dropped whenever a
    step is planned with a seat to spare, so the next gap starts at the next free."""
    now = [0.0]
    gaps = SeatGaps(lambda: now[0])
    gaps.contended(True)
    gaps.freed()
    now[0] = 2.0
    gaps.freed()  # one gap of 2 s
    gaps.contended(False)  # seats to spare, then 100 s of nothing
    now[0] = 102.0
    gaps.contended(True)
    gaps.freed()  # the spell's first free: a reference, no gap
    assert gaps.interval_s == pytest.approx(2.0)
    now[0] = 103.0
    gaps.freed()
    assert gaps.interval_s == pytest.approx(0.9 * 2.0 + 0.1 * 1.0)


def test_a_burst_after_an_idle_spell_is_not_refused_for_it():
    """Two bursts 100 s apart: the second's estimate is its own turnover (0.5 s a seat), not
    the idle time since the first burst's last free (it read ~10 s a seat: wrong 503s)."""
    now = [0.0]
    cfg = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=64)
    s = ARScheduler(cfg, clock=lambda: now[0])

    def burst(at: float, name: str) -> None:
        now[0] = at
        for i in range(4):
            s.add_request(req(f"{name}{i}", prompt_len=4, max_new=50))
        s.schedule()  # two seated, two wait
        for i in range(4):
            now[0] = at + 0.5 * (i + 1)
            s.finish(f"{name}{i}", "abort")
            s.schedule()

    burst(0.0, "a")
    assert s.seats.interval_s == pytest.approx(0.5)
    burst(100.0, "b")
    assert s.seats.interval_s == pytest.approx(0.5)
    for i in range(3):
        s.add_request(req(f"c{i}", prompt_len=4, max_new=50))
    s.schedule()  # c0 and c1 seated, c2 waits
    assert s.first_audio_wait_s() == pytest.approx(2 * 0.5)


def test_retry_after_is_capped():
    from omniflow.serve.errors import MAX_RETRY_AFTER_S, overloaded

    assert overloaded("full", 1955.7).headers["Retry-After"] == str(MAX_RETRY_AFTER_S)
    assert overloaded("full", 2.2).headers["Retry-After"] == "3"


def test_paused_requests_in_the_queue_do_not_make_seats_contended():
    """A request paused while queued (its client not reading) takes no seat: with seats free
    the stage is not contended, and an idle spell does not become a seat gap."""
    now = [0.0]
    cfg = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=64)
    s = ARScheduler(cfg, clock=lambda: now[0])
    s.seats.freed()  # a reference from a spell before
    for name in ("p0", "p1"):
        s.add_request(req(name, prompt_len=4, max_new=50))
        s.pause(name)
    s.schedule()  # two seats free, two paused in the queue: not contended
    now[0] = 100.0
    s.seats.freed()
    assert s.seats.interval_s is None  # no 100 s gap
