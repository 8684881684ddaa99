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
    assert s.first_audio_wait_s() == 0.0  # a seat is free, nobody is pushed
    clock.step_s = 0.1  # slower than real time
    assert s.first_audio_wait_s() == pytest.approx(0.38)
