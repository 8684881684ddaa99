"""An arrival's step of its own (`seating.arrivals_alone`): while every running stream's
playback slack covers two steps, the running streams sit the step out and the arrivals are
prefilled alone (their first audio waits for a prefill, not for a prefill beside every
running row); a stream near its deadline, or one still in its prompt, keeps the step as it
was. Sitting out changes when a stream decodes, not what: the codes stay the single-step
codes."""

from __future__ import annotations

import itertools

import pytest

from omniflow.sched.ar import ARScheduler
from omniflow.sched.playback import PlaybackClock
from omniflow.sched.seating import arrivals_alone
from tests.factories import talker_engine
from tests.sched.test_ar_scheduler import FakeRunner, sched
from tests.sched.test_ar_scheduler import req as prompt_req
from tests.sched.test_seating import clock, req
from tests.stages.test_talker_engine import collect, fixed


def alone(running, c, arrivals=1, queued=None, held=(), rows=8, spare_blocks=100) -> bool:
    queued = arrivals if queued is None else queued
    return arrivals_alone(running, arrivals, queued, set(held), rows, spare_blocks, c)


def test_the_running_sit_out_while_every_stream_has_a_frame_in_hand():
    c = clock()  # now = 10.0, 80 ms frames, 40 ms margin
    ahead, next_ = req("ahead", 30, 0), req("next", 3, 1)
    for r in (ahead, next_):
        r.num_computed_tokens = r.num_tokens - 1  # decoding: its last token to compute
    c.frames_made("ahead", 0, at=9.5)  # 1.86 s of slack
    c.frames_made("next", 0, at=9.9)  # 9.9 + 3 * 0.08 - 0.04 - 10 = 0.10 s
    c.observe_step(0.02, steps=1, rows=2)  # 2 steps: 40 ms; a frame: 80 ms <= 100 ms
    assert alone([ahead, next_], c)
    assert not alone([ahead, next_], c, arrivals=0)  # no arrival: nothing to seat
    assert not alone([ahead, next_], None)  # no clock: no slack known
    for _ in range(10):
        c.observe_step(0.06, steps=1, rows=2)  # 2 steps: ~120 ms > 100 ms
    assert not alone([ahead, next_], c)
    # its window is in flight (fenced): it would not run this step anyway
    assert alone([ahead, next_], c, held={"next"})


def test_no_sitting_out_when_saturated_or_short_of_kv():
    c = clock()
    ahead = req("ahead", 30, 0)
    ahead.num_computed_tokens = ahead.num_tokens - 1
    c.frames_made("ahead", 0, at=9.5)
    c.observe_step(0.01, steps=1, rows=1)
    assert alone([ahead], c)
    assert not alone([ahead], c, queued=2)  # more waiting than seats: throughput first
    # after the arrival's context, a block for each next token (ahead's and the arrival's)
    assert alone([ahead], c, spare_blocks=2)
    assert not alone([ahead], c, spare_blocks=1)


def test_the_step_time_is_that_of_a_steps_rows():
    """With more residents than a step has rows, two steps are two steps of `rows` rows
    (a batch of all residents is never run, never measured)."""
    c = clock()
    streams = [req(f"s{i}", 3, i) for i in range(4)]
    for r in streams:
        r.num_computed_tokens = r.num_tokens - 1
        c.frames_made(r.request_id, 0, at=9.9)  # 100 ms of slack each
    c.observe_step(0.02, steps=1, rows=2)  # two rows: 20 ms a step
    c.observe_step(0.3, steps=1, rows=1)  # the overall estimate, now ~0.08 s, says no
    assert alone(streams, c, rows=2)
    assert not alone(streams, c, rows=8)  # 4 rows: unmeasured, the overall estimate


def test_a_fresh_stream_keeps_the_step():
    """One frame made 10 ms ago: 30 ms of slack, three steps' worth at 10 ms, but less than
    a frame in hand (a prefill step is longer than the decode steps that set the estimate)."""
    c = clock()
    ahead, fresh = req("ahead", 30, 0), req("fresh", 1, 1)
    for r in (ahead, fresh):
        r.num_computed_tokens = r.num_tokens - 1
    c.frames_made("ahead", 0, at=9.5)
    c.frames_made("fresh", 0, at=9.99)
    c.observe_step(0.01, steps=1, rows=2)
    assert not alone([ahead, fresh], c)
    unclocked = req("unclocked", 0, 2)  # its first frame in flight: 40 ms, as if just made
    unclocked.num_computed_tokens = unclocked.num_tokens - 1
    assert not alone([ahead, unclocked], c)
    assert alone([ahead], c)


def test_a_stream_in_its_prompt_keeps_the_step():
    c = clock()
    ahead, chunked = req("ahead", 30, 0), req("chunked", 0, 1)
    ahead.num_computed_tokens = ahead.num_tokens - 1
    chunked.num_computed_tokens = 0  # a long prompt prefilled in chunks: 2 tokens to go
    c.frames_made("ahead", 0, at=9.5)
    c.observe_step(0.01, steps=1, rows=2)
    assert not alone([ahead, chunked], c)
    assert alone([ahead], c)


def _scheduler(now: list[float], **kw) -> ARScheduler:
    """Single steps (the fake runner makes one token a step) with a playback clock read
    from `now`; `kw`: scheduler limits other than `sched`'s (2048 KV blocks here)."""
    clock = PlaybackClock(0.08, 0.04, now=lambda: now[0])
    return sched(playback=clock, **{"num_kv_blocks": 2048, **kw})


def _run(s: ARScheduler, runner: FakeRunner, now: list[float], step_s: float) -> set[str]:
    """Plan a step, let it take `step_s`, apply it: the rows it ran."""
    plan = s.schedule()
    now[0] += step_s
    s.update(plan, runner.execute(plan))
    return set(plan.num_scheduled_tokens)


def test_an_arrival_is_prefilled_alone_and_the_others_go_on_after():
    now = [0.0]
    s, runner = _scheduler(now), FakeRunner()
    s.add_request(prompt_req("a", max_new=50))
    s.add_request(prompt_req("b", max_new=50))
    assert _run(s, runner, now, 0.01) == {"a", "b"}  # prompts; their first frames at 0.01
    assert _run(s, runner, now, 0.01) == {"a", "b"}  # second frames: due by 0.01 + 0.08
    s.add_request(prompt_req("c", max_new=50))
    # a and b: third frame due by 0.01 + 2 * 0.08 - 0.04 = 0.13, 110 ms away: a frame and
    # two 10 ms steps in hand, so they sit the step out
    measured = dict(s.playback.steps_by_rows)
    assert _run(s, runner, now, 0.01) == {"c"}
    assert s.window_stats.arrival_steps == 1
    # a prefill alone is not a decode step: the step-time estimate does not take it in
    assert s.playback.steps_by_rows == measured
    assert _run(s, runner, now, 0.01) == {"a", "b", "c"}
    assert sum(s.playback.steps_by_rows.values()) == sum(measured.values()) + 1


def test_a_stream_near_its_deadline_shares_the_arrival_step():
    now = [0.0]
    s, runner = _scheduler(now), FakeRunner()
    s.add_request(prompt_req("a", max_new=50))
    assert _run(s, runner, now, 0.01) == {"a"}  # first frame at 0.01
    assert _run(s, runner, now, 0.01) == {"a"}  # second at 0.02: the third due by 0.13
    s.add_request(prompt_req("b", max_new=50))
    assert _run(s, runner, now, 0.01) == {"b"}  # 110 ms in hand: b is seated alone
    now[0] += 0.03  # a: 0.13 - 0.06 = 70 ms, less than a frame
    s.add_request(prompt_req("c", max_new=50))
    assert _run(s, runner, now, 0.01) == {"a", "b", "c"}
    assert s.window_stats.arrival_steps == 1


def test_an_arrival_is_not_seated_alone_into_a_preemption():
    """Seven 4-token KV blocks: after twelve frames `a` holds four, the arrival's 8-token
    prompt takes two of the three left; alone, the next step would need two more (a's and
    its own next token) and preempt the newest, the arrival. So it shares a's step."""
    now = [0.0]
    s, runner = _scheduler(now, num_kv_blocks=7), FakeRunner()
    s.add_request(prompt_req("a", prompt_len=4, max_new=100))
    for _ in range(12):
        _run(s, runner, now, 0.005)
    s.add_request(prompt_req("c", prompt_len=8, max_new=100))
    assert _run(s, runner, now, 0.005) == {"a", "c"}
    assert s.window_stats.arrival_steps == 0


def test_a_sat_out_step_leaves_a_second_arrival_the_running_streams_room():
    """Thirty streams sit out; arrivals of 30 and 35 tokens under a 64-token budget. The
    room next step is what the running streams leave then (64 - 30 - 1), so the second
    prompt is not held back for a step that could take it whole: it starts now."""
    now = [0.0]
    s, runner = _scheduler(now, max_num_seqs=40), FakeRunner()
    for k in range(30):
        s.add_request(prompt_req(f"s{k}", prompt_len=2, max_new=200))
    for _ in range(20):
        _run(s, runner, now, 0.005)
    s.add_request(prompt_req("A", prompt_len=30, max_new=50))
    s.add_request(prompt_req("B", prompt_len=35, max_new=50))
    assert _run(s, runner, now, 0.005) == {"A", "B"}
    assert s.window_stats.arrival_steps == 1


def test_no_step_measured_no_sitting_out():
    now = [0.0]
    s, runner = _scheduler(now), FakeRunner()
    s.add_request(prompt_req("a", max_new=50))
    assert _run(s, runner, now, 0.0) == {"a"}  # a step that took no time measures nothing
    s.add_request(prompt_req("b", max_new=50))
    assert _run(s, runner, now, 0.0) == {"a", "b"}
    assert s.window_stats.arrival_steps == 0


def test_an_arrival_the_admission_does_not_take_leaves_the_step_to_the_running(monkeypatch):
    """The safety net: `rows_for_arrivals` and the admission loop agree on who is seated;
    were they ever to differ, the running streams still get the step (an empty plan would
    be planned again the same way, forever)."""
    now = [0.0]
    s, runner = _scheduler(now), FakeRunner()
    s.add_request(prompt_req("a", max_new=50))
    _run(s, runner, now, 0.01)
    s.add_request(prompt_req("b", max_new=50))
    s.pause("b")  # the admission loop skips a paused request; rows_for_arrivals, patched, not
    monkeypatch.setattr("omniflow.sched.ar.rows_for_arrivals", lambda *a: (1, 100))
    assert _run(s, runner, now, 0.01) == {"a"}
    assert s.window_stats.arrival_steps == 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_sitting_out_keeps_every_requests_codes(async_scheduling):
    """Seeded requests arriving while others run: the steps that seat them alone leave the
    codes of every request those of the same requests run one after the other (under async
    scheduling too, where a plan is made while the step before it runs)."""
    reqs = [fixed(f"r{i}", 20, seed=i, text=f"Same length {i}.") for i in range(3)]
    want = {}
    for r in reqs:
        base, proc = talker_engine()
        base.add_request(proc.make_request(r))
        want.update(collect(base.run_until_idle()))
    engine, proc = talker_engine(window_k=4, async_scheduling=async_scheduling)
    ticks = itertools.count()
    engine.scheduler.playback = PlaybackClock(0.08, 0.04, now=lambda: next(ticks) * 0.001)
    outputs = []
    for r in reqs:
        engine.add_request(proc.make_request(r))
        for _ in range(3):
            outputs.extend(engine.step())
    outputs.extend(engine.run_until_idle())
    alone = engine.scheduler.window_stats.arrival_steps
    # sync: r1 and r2 seated alone; async: a step planned while a window of the others is
    # in flight (fenced) seats one alone without anyone sitting out, so at least one
    assert alone == 2 if not async_scheduling else alone >= 1
    assert collect(outputs) == want
