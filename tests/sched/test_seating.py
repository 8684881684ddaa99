"""Earliest deadline first (`sched/seating.py`): with more resident requests than a step has
rows, a new arrival or the stream nearest its playback deadline gets a row and the one
furthest ahead sits the step out; how many may be resident follows the measured step time;
the key is refused where nothing could choose who sits out."""

from __future__ import annotations

import itertools

import pytest

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.config.schema import SchedulerConfig
from omniflow.core.request import Request, SamplingParams
from omniflow.errors import ConfigError
from omniflow.sched.playback import PlaybackClock
from omniflow.sched.seating import preemption_victim, resident_capacity, row_order
from tests.factories import talker_engine
from tests.stages.test_talker_engine import collect, fixed


def clock(at: float = 10.0) -> PlaybackClock:
    return PlaybackClock(frame_s=0.08, margin_s=0.04, now=lambda: at)


def req(rid: str, frames: int, arrival: int) -> Request:
    r = Request(request_id=rid, prompt_len=2, payload=None, sampling=SamplingParams(), seed=0)
    r.output_tokens = [0] * frames
    r.arrival = arrival
    return r


def test_rows_go_to_the_new_and_the_tightest_streams_first():
    c = clock()
    ahead, tight, new = req("ahead", 30, 0), req("tight", 2, 1), req("new", 0, 2)
    c.frames_made("ahead", 0, at=9.5)  # 9.5 + 30 * 0.08 - 0.04 - 10 = 1.86 s of slack
    c.frames_made("tight", 0, at=9.95)  # 9.95 + 2 * 0.08 - 0.04 - 10 = 0.07 s
    running = [ahead, tight, new]
    assert row_order(running, 3, c) == running  # all fit: as they came
    assert row_order(running, 2, c) == [new, tight, ahead]  # the one far ahead waits
    assert row_order(running, 2, None) == running  # no clock: as they came


def test_residents_follow_the_measured_step_time():
    cfg = SchedulerConfig(max_num_seqs=2, max_resident_seqs=16)
    c = clock()
    assert resident_capacity(cfg, c) == 2  # no step measured: one request a row
    c.observe_step(0.001, steps=1, rows=1)
    assert resident_capacity(cfg, c) == 2  # a smaller batch says nothing of two rows
    c.observe_step(0.02, steps=1, rows=2)
    # 2 rows every 20 ms make 2 frames of 80 ms: 0.8 * 2 * 0.08 / 0.02 = 6.4 streams
    assert resident_capacity(cfg, c) == 6
    for _ in range(20):
        c.observe_step(0.002, steps=1, rows=2)
    assert resident_capacity(cfg, c) == 16  # the key caps it
    assert resident_capacity(SchedulerConfig(max_num_seqs=2), c) == 2  # unset: the rows
    assert resident_capacity(cfg, None) == 2


def test_step_time_is_kept_per_batch_size_class():
    c = clock()
    c.observe_step(0.010, steps=1, rows=1)
    c.observe_step(0.040, steps=2, rows=3)  # 20 ms a step, class 4
    assert c.step_s_at(1) == pytest.approx(0.010)
    assert c.step_s_at(4) == pytest.approx(0.020)
    assert c.step_s_at(2) == pytest.approx(0.020)  # unmeasured: the next larger class
    assert c.step_s_at(8) == pytest.approx(c.step_s)  # none larger: the overall estimate


def test_a_victim_is_never_a_request_already_planned():
    a, b, c = req("a", 1, 0), req("b", 1, 1), req("c", 1, 2)
    assert preemption_victim([a, b, c], a, set(), {}) is c
    assert preemption_victim([a, b, c], a, set(), {"c": 1}) is b
    assert preemption_victim([a, b, c], a, {"b"}, {}) is b  # paused first
    assert preemption_victim([a, b, c], a, set(), {"b": 1, "c": 1}) is a  # itself


@pytest.mark.parametrize("window_k", [0, 4])
def test_streams_take_turns_and_keep_their_codes(window_k):
    reqs = [fixed(f"r{i}", 24, seed=i, text=f"Same length {i}.") for i in range(3)]
    base, proc = talker_engine()
    for r in reqs:
        base.add_request(proc.make_request(r))
    want = collect(base.run_until_idle())
    # 2 rows, up to 3 resident; each clock reading 1 ms: steps look fast, so all 3 fit
    engine, proc = talker_engine(max_num_seqs=2, max_resident_seqs=3, window_k=window_k)
    ticks = itertools.count()
    engine.scheduler.playback = PlaybackClock(0.08, 0.04, now=lambda: next(ticks) * 0.001)
    for r in reqs:
        engine.add_request(proc.make_request(r))
    rows_planned: list[int] = []
    plan_step = engine.scheduler.schedule

    def spy():
        plan = plan_step()
        rows_planned.append(len(plan.num_scheduled_tokens))
        return plan

    engine.scheduler.schedule = spy
    outputs, most_resident = [], 0
    while engine.has_work:
        outputs.extend(engine.step())
        most_resident = max(most_resident, len(engine.scheduler.running))
    most_rows = max(rows_planned)
    assert most_resident == 3 and most_rows == 2  # three streams shared two rows
    assert collect(outputs) == want


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["scheduler.max_resident_seqs=4"], "below max_num_seqs"),
        (["scheduler.max_resident_seqs=64", "playback_margin_ms=null"], "needs playback"),
    ],
)
def test_the_key_is_refused_where_it_could_not_act(overrides, needle):
    t = "pipeline.stages.talker."
    with pytest.raises(ConfigError) as err:
        build_graph(
            compose(
                ["pipeline=qwen3_tts_fused", "platform=cpu", "pipeline.stages.talker.window_k=8"]
                + [t + o for o in overrides]
            )
        )
    assert "talker.scheduler.max_resident_seqs" in str(err.value) and needle in str(err.value)


def test_the_two_stage_talker_refuses_it():
    t = "pipeline.stages.talker."
    with pytest.raises(ConfigError, match="needs stream_decode"):
        build_graph(
            compose(
                [
                    "pipeline=qwen3_tts",
                    "platform=cpu",
                    f"{t}window_k=8",
                    f"{t}scheduler.max_resident_seqs=64",
                ]
            )
        )


def test_rows_are_not_kept_for_arrivals_that_cannot_be_admitted():
    """Two rows, four residents, and two arrivals whose prompts do not fit the KV blocks the
    running streams leave: the running streams keep their rows and finish, and then the
    arrivals are served (no step without rows)."""
    engine, proc = talker_engine(
        max_num_seqs=2, max_resident_seqs=4, window_k=4, block_size=4, num_kv_blocks=64
    )
    ticks = itertools.count()
    engine.scheduler.playback = PlaybackClock(0.08, 0.04, now=lambda: next(ticks) * 0.001)
    for i in range(2):
        engine.add_request(proc.make_request(fixed(f"run{i}", 80, seed=i)))
    while engine.scheduler.kv.num_used_blocks < 40:
        engine.step()
    for i in range(2):
        engine.add_request(proc.make_request(fixed(f"new{i}", 20, seed=10 + i, text="word " * 20)))
    outputs = engine.run_until_idle(max_steps=2000)
    ended = {o.request_id for o in outputs if o.finished}
    assert ended == {"run0", "run1", "new0", "new1"}
