"""Backpressure in the schedulers: a paused request is held out of planning and keeps its
state (KV blocks, queued chunks); resuming it continues exactly where it stopped."""

from __future__ import annotations

from omniflow.core.step import RequestStepOutput, StepResult
from omniflow.sched.generation import GenRequest
from tests.sched.test_ar_scheduler import FakeRunner, req, sched
from tests.sched.test_generation_scheduler import F, answer
from tests.sched.test_generation_scheduler import sched as gen_sched


def step(s, runner: FakeRunner):
    plan = s.schedule()
    s.update(plan, runner.execute(plan))
    return plan


def test_a_paused_request_keeps_its_blocks_and_is_not_planned_until_resumed():
    s = sched()
    s.add_request(req("a", max_new=6))
    s.add_request(req("b", max_new=6))
    runner = FakeRunner()
    step(s, runner)  # both prefilled, one token each
    blocks = s.kv.block_ids("a")
    s.pause("a")
    for _ in range(3):
        plan = step(s, runner)
        assert "a" not in plan.num_scheduled_tokens and "b" in plan.num_scheduled_tokens
    a = s.requests["a"]
    assert len(a.output_tokens) == 1 and s.kv.block_ids("a") == blocks  # state kept
    assert s.gauges().paused == 1 and s.gauges().running == 2
    s.resume("a")
    while s.has_unfinished:
        step(s, runner)
    assert s.gauges().paused == 0 and s.kv.num_used_blocks == 0


def test_a_pause_is_announced_downstream_once_as_held():
    s = sched()
    s.add_request(req("a"))
    s.pause("a")
    s.pause("a")
    s.pause("gone")  # raced with its end: ignored
    held = s.drain_outputs()
    assert [(o.request_id, o.held, o.finished) for o in held] == [("a", True, False)]


def test_under_kv_pressure_a_paused_request_gives_up_its_blocks_first():
    """The paused request makes no progress, so it is the victim, not the newest running
    one; it stays paused in the waiting queue (others are admitted past it) and recomputes
    when resumed."""
    s = sched(num_kv_blocks=8, block_size=4, max_model_len=32, max_num_batched_tokens=64)
    s.add_request(req("paused", prompt_len=8, max_new=20))
    s.add_request(req("active", prompt_len=8, max_new=20))
    runner = FakeRunner()
    step(s, runner)
    s.pause("paused")
    for _ in range(20):
        if s.num_preemptions:
            break
        plan = step(s, runner)
        assert "paused" not in plan.num_scheduled_tokens
    assert s.num_preemptions == 1
    assert [r.request_id for r in s.running] == ["active"]
    assert [r.request_id for r in s.waiting] == ["paused"] and not s.kv.block_ids("paused")
    s.add_request(req("late", prompt_len=4, max_new=1))
    plan = step(s, runner)  # admitted past the paused request at the head of the queue
    assert "late" in plan.num_scheduled_tokens and "paused" not in plan.num_scheduled_tokens
    s.resume("paused")
    while s.has_unfinished:
        step(s, runner)
    assert s.kv.num_used_blocks == 0


def test_a_paused_receiver_schedules_nothing_and_its_deadline_does_not_run():
    s, clock = gen_sched(timeout=5.0)
    s.add_request(GenRequest("r"))
    s.receive("r", (F,), False)
    s.update(p := s.schedule(), answer(p))  # first chunk decoded: the deadline is armed
    s.receive("r", (F,) * 3, False)
    s.pause("r")
    clock.t = 100.0
    p = s.schedule()
    assert p.is_empty and s.drain_outputs()[0].held and "r" in s.requests
    assert s.gauges().paused == 1
    s.resume("r")  # the deadline restarts now, and the queued chunk runs
    p = s.schedule()
    assert list(p.num_scheduled_tokens) == ["r"]
    (out,) = s.update(p, answer(p))
    assert out.consumed_frames == 3
    clock.t = 104.0
    s.schedule()
    assert s.drain_outputs() == []
    clock.t = 110.0
    s.schedule()
    (err,) = s.drain_outputs()
    assert err.finish_reason == "error"


def test_resuming_restarts_an_armed_deadline_from_now():
    """A receiver paused for longer than its deadline, with nothing queued, is not failed the
    moment it resumes: the pause was not its upstream stalling."""
    s, clock = gen_sched(timeout=5.0)
    s.add_request(GenRequest("r"))
    s.receive("r", (F,), False)
    s.update(p := s.schedule(), answer(p))
    s.pause("r")
    clock.t = 50.0
    s.resume("r")
    clock.t = 54.0
    s.schedule()
    assert [o for o in s.drain_outputs() if o.finished] == []
    clock.t = 56.0
    s.schedule()
    (err,) = [o for o in s.drain_outputs() if o.finished]
    assert err.finish_reason == "error"


def test_every_receiver_output_says_how_many_frames_it_used_up():
    s, _ = gen_sched()
    s.add_request(GenRequest("r"))
    sizes = [1, 4, 2]
    for i, n in enumerate(sizes):
        s.receive("r", (F,) * n, i == len(sizes) - 1)
    used = []
    while s.has_unfinished:
        p = s.schedule()
        result = StepResult(
            p.step_id, {r: RequestStepOutput(audio=[1]) for r in p.num_scheduled_tokens}
        )
        used += [o.consumed_frames for o in s.update(p, result)]
    assert used == sizes
