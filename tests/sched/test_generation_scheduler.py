"""Chunk scheduling rules of a receiving stage with a controllable clock."""

from __future__ import annotations

from omniflow.config.schema import SchedulerConfig
from omniflow.core.step import RequestStepOutput, StepResult
from omniflow.sched.generation import GenerationScheduler, GenRequest

F = (0,) * 16


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def sched(budget: int = 100, seqs: int = 4, timeout: float = 5.0):
    clock = Clock()
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=seqs)
    return GenerationScheduler(
        cfg, tokens_per_frame=1, receive_timeout_s=timeout, clock=clock
    ), clock


def answer(plan):
    return StepResult(
        plan.step_id, {r: RequestStepOutput(audio=[1]) for r in plan.num_scheduled_tokens}
    )


def test_chunk_is_scheduled_whole_or_waits_intact():
    s, _ = sched(budget=100)
    s.add_request(GenRequest("a"))
    s.add_request(GenRequest("b"))
    s.receive("a", (F,) * 80, False)
    s.receive("b", (F,) * 30, False)
    p = s.schedule()
    assert dict(p.num_scheduled_tokens) == {"a": 80}  # b's 30 do not fit the 20 left
    assert len(p.chunks["a"].frames) == 80
    s.update(p, answer(p))
    p2 = s.schedule()
    assert dict(p2.num_scheduled_tokens) == {"b": 30}  # intact, never split
    assert len(p2.chunks["b"].frames) == 30


def test_oversized_chunk_ends_the_request_once_and_others_continue():
    s, _ = sched(budget=50)
    s.add_request(GenRequest("big"))
    s.add_request(GenRequest("ok"))
    s.receive("big", (F,) * 51, False)
    s.receive("ok", (F,) * 10, True)
    p = s.schedule()
    errors = s.drain_outputs()
    assert [(o.request_id, o.finish_reason) for o in errors] == [("big", "error")]
    assert "budget" in errors[0].error
    assert dict(p.num_scheduled_tokens) == {"ok": 10}
    s.receive("big", (F,) * 5, True)  # later chunks of an ended request are dropped
    outs = s.update(p, answer(p))
    assert [(o.request_id, o.finished) for o in outs] == [("ok", True)]
    assert s.drain_outputs() == [] and not s.has_unfinished


def test_rejection_waits_for_the_in_flight_chunk():
    s, _ = sched(budget=50)
    s.add_request(GenRequest("a"))
    s.receive("a", (F,) * 10, False)
    p1 = s.schedule()  # chunk 1 in flight (async)
    s.receive("a", (F,) * 60, False)  # too big for the whole budget
    p2 = s.schedule()
    assert p2.is_empty and s.drain_outputs() == []  # not rejected while chunk 1 is in flight
    outs = s.update(p1, answer(p1))
    assert outs[0].audio == [1] and not outs[0].finished  # last valid audio first
    s.schedule()
    errs = s.drain_outputs()
    assert [(o.request_id, o.finish_reason) for o in errs] == [("a", "error")]


def test_receive_deadline_ends_a_stalled_request_with_one_error():
    s, clock = sched(timeout=5.0)
    s.add_request(GenRequest("slow"))
    clock.t = 1000.0  # queued upstream for a long time: no first chunk yet is not a stall
    s.schedule()
    assert s.drain_outputs() == []
    clock.t = 0.0
    s.receive("slow", (F,) * 2, False)
    p = s.schedule()
    s.update(p, answer(p))
    clock.t = 4.0
    s.schedule()
    assert s.drain_outputs() == []
    clock.t = 60.0
    s.schedule()
    errs = s.drain_outputs()
    assert len(errs) == 1 and "no chunk" in errs[0].error
    s.schedule()
    assert s.drain_outputs() == [] and not s.has_unfinished


def test_max_num_seqs_caps_started_requests():
    s, _ = sched(seqs=1)
    for r in ("a", "b"):
        s.add_request(GenRequest(r))
        s.receive(r, (F,), False)
    p = s.schedule()
    assert list(p.num_scheduled_tokens) == ["a"]
    s.update(p, answer(p))
    s.receive("a", (F,), True)
    p = s.schedule()
    assert list(p.num_scheduled_tokens) == ["a"]  # b waits: a still holds the only slot
    s.update(p, answer(p))
    p = s.schedule()
    assert list(p.num_scheduled_tokens) == ["b"]


def test_a_held_request_waits_past_its_deadline_until_the_next_chunk():
    """The upstream paused the request (preempted): alive, so no deadline until it sends
    again; the next chunk re-arms it."""
    s, clock = sched(timeout=5.0)
    s.add_request(GenRequest("r"))
    s.receive("r", (F,), False)
    s.update(p := s.schedule(), answer(p))  # first chunk decoded; the deadline runs
    s.hold("r")
    clock.t = 100.0
    s.schedule()
    assert s.drain_outputs() == [] and "r" in s.requests
    s.receive("r", (F,), False)  # re-armed at t=100
    s.update(p := s.schedule(), answer(p))
    clock.t = 106.0
    s.schedule()
    (err,) = s.drain_outputs()
    assert err.request_id == "r" and err.finish_reason == "error"
