"""Scheduler rules on the real ARScheduler; results come from a tiny helper that
answers each plan the way a runner would (one token per request that reached its end)."""

from __future__ import annotations

import itertools

import pytest

from omniflow.config.schema import SchedulerConfig
from omniflow.core.request import Request, RequestState, SamplingParams
from omniflow.core.step import RequestStepOutput, StepPlan, StepResult
from omniflow.sched.ar import ARScheduler
from omniflow.sched.playback import PlaybackClock

EOS = 99


def sched(playback: PlaybackClock | None = None, **kw) -> ARScheduler:
    base = dict(
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
        block_size=4,
        num_kv_blocks=256,
    )
    base.update(kw)
    return ARScheduler(SchedulerConfig(**base), playback=playback)


def req(rid: str, prompt_len: int = 8, max_new: int = 5, **kw) -> Request:
    sampling = SamplingParams(max_new_tokens=max_new, stop_token_ids=(EOS,), **kw)
    return Request(request_id=rid, prompt_len=prompt_len, payload=None, sampling=sampling, seed=0)


class FakeRunner:
    """Answers plans like the runner: a token for each request whose step reaches its end.

    It tracks its own view (prompt + sampled tokens), exactly as the real runner does."""

    def __init__(self, script: dict[str, list[int]] | None = None) -> None:
        self.known: dict[str, int] = {}
        self.computed: dict[str, int] = {}
        self.script = script or {}
        self.counter = itertools.count(1)

    def execute(self, plan: StepPlan) -> StepResult:
        for rid in plan.finished_ids:
            self.known.pop(rid, None)
        for d in plan.new_requests:
            self.known[d.request_id] = d.prompt_len + len(d.output_tokens)
            self.computed[d.request_id] = d.num_computed_tokens
        for c in plan.cached_requests:
            self.computed[c.request_id] = c.num_computed_tokens
        outs = {}
        for rid, n in plan.num_scheduled_tokens.items():
            end = self.computed[rid] + n
            assert end <= self.known[rid]
            self.computed[rid] = end
            if end == self.known[rid]:
                script = self.script.get(rid)
                tok = script.pop(0) if script else next(self.counter) % 50
                self.known[rid] += 1
                outs[rid] = RequestStepOutput(tokens=(tok,), frames=(None,))
        return StepResult(plan.step_id, outs)


def run(s: ARScheduler, runner: FakeRunner, steps: int = 1000):
    plans, outputs = [], []
    for _ in range(steps):
        if not s.has_unfinished:
            break
        plan = s.schedule()
        plans.append(plan)
        outputs.extend(s.update(plan, runner.execute(plan)))
    return plans, outputs


def test_budget_and_max_num_seqs_are_respected():
    s = sched(max_num_seqs=3, max_num_batched_tokens=20)
    for i in range(6):
        s.add_request(req(f"r{i}", prompt_len=7))
    plans, _ = run(s, FakeRunner())
    assert plans
    for p in plans:
        assert p.total_num_tokens <= 20
        assert len(p.num_scheduled_tokens) <= 3
        assert p.total_num_tokens == sum(p.num_scheduled_tokens.values())
    assert not s.has_unfinished


def test_long_prompt_is_prefilled_in_chunks():
    s = sched(max_num_batched_tokens=16)
    s.add_request(req("long", prompt_len=40, max_new=2))
    runner = FakeRunner()
    first = s.schedule()
    assert dict(first.num_scheduled_tokens) == {"long": 16}
    assert s.update(first, runner.execute(first)) == []  # no token before the prompt ends
    second = s.schedule()
    assert dict(second.num_scheduled_tokens) == {"long": 16}
    s.update(second, runner.execute(second))
    third = s.schedule()
    assert dict(third.num_scheduled_tokens) == {"long": 8}
    outs = s.update(third, runner.execute(third))
    assert len(outs) == 1 and len(outs[0].tokens) == 1


def test_running_requests_come_before_waiting_ones():
    s = sched(max_num_batched_tokens=10, max_num_seqs=4)
    s.add_request(req("a", prompt_len=6, max_new=5))
    runner = FakeRunner()
    p = s.schedule()
    s.update(p, runner.execute(p))
    s.add_request(req("b", prompt_len=30))
    p = s.schedule()
    # a's decode token is planned first; b only gets what is left of the budget.
    assert list(p.num_scheduled_tokens) == ["a", "b"]
    assert dict(p.num_scheduled_tokens) == {"a": 1, "b": 9}


def test_preemption_when_blocks_run_out_and_resumption():
    # 6 blocks of 4 tokens: two requests of 8-token prompts use 4 blocks; growing both
    # past 12 tokens needs 8 blocks, so the newest is preempted and recomputed later.
    s = sched(num_kv_blocks=6, block_size=4, max_num_batched_tokens=64, max_model_len=24)
    s.add_request(req("old", prompt_len=8, max_new=8))
    s.add_request(req("new", prompt_len=8, max_new=8))
    runner = FakeRunner()
    plans, outputs = run(s, runner)
    assert s.num_preemptions >= 1
    preempt_plans = [p for p in plans if "new" in p.finished_ids]
    assert preempt_plans, "the runner must be told to drop the preempted request"
    resumed = [d for p in plans for d in p.new_requests if d.request_id == "new"]
    assert len(resumed) >= 2 and resumed[-1].num_computed_tokens == 0
    assert len(resumed[-1].output_tokens) > 0  # recompute carries what was generated
    done = {o.request_id: o for o in outputs if o.finished}
    assert set(done) == {"old", "new"}
    counts = {rid: sum(len(o.tokens) for o in outputs if o.request_id == rid) for rid in done}
    assert counts == {"old": 8, "new": 8}
    assert s.kv.num_used_blocks == 0


def test_newest_running_request_is_the_victim():
    s = sched(num_kv_blocks=5, block_size=4, max_model_len=20)
    for rid in ("r0", "r1"):
        s.add_request(req(rid, prompt_len=8, max_new=8))
    runner = FakeRunner()
    p = s.schedule()
    s.update(p, runner.execute(p))
    states = {}
    for _ in range(10):
        p = s.schedule()
        s.update(p, runner.execute(p))
        states = {r.request_id: r.state for r in s.requests.values()}
        if RequestState.PREEMPTED in states.values():
            break
    assert states.get("r1") == RequestState.PREEMPTED
    assert states.get("r0") == RequestState.RUNNING


@pytest.mark.parametrize("how", ["finish", "abort_running", "abort_waiting"])
def test_blocks_return_to_the_pool(how):
    s = sched(max_num_seqs=1, num_kv_blocks=64)
    s.add_request(req("a", prompt_len=9, max_new=3))
    s.add_request(req("b", prompt_len=9, max_new=3))
    runner = FakeRunner()
    p = s.schedule()
    s.update(p, runner.execute(p))
    assert s.kv.num_used_blocks > 0
    if how == "finish":
        run(s, runner)
    elif how == "abort_running":
        assert s.finish("a", "abort")
        assert s.finish("b", "abort")
    else:
        assert s.requests["b"].state == RequestState.WAITING
        assert s.finish("b", "abort")
        assert s.finish("a", "abort")
    assert s.kv.num_used_blocks == 0
    assert s.kv.pool.num_free == 64
    assert not s.requests
    nxt = s.schedule()  # delivers the runner-side drops
    assert nxt.is_empty
    assert not s.has_unfinished
    if how != "finish":
        assert {"a"} <= set(nxt.finished_ids)


def test_eos_ends_the_request_and_min_tokens_hold_it_back():
    s = sched()
    s.add_request(req("a", max_new=10, min_new_tokens=3))
    runner = FakeRunner(script={"a": [EOS, EOS, EOS, EOS, 5]})
    _, outputs = run(s, runner)
    tokens = [t for o in outputs for t in o.tokens]
    # A real runner masks EOS while fewer than min_new_tokens exist; the scheduler must not
    # stop early even if one arrives, and stops at the first EOS after min tokens.
    assert tokens == [EOS, EOS, EOS, EOS]
    assert outputs[-1].finish_reason == "stop"


def test_max_new_tokens_ends_the_request():
    s = sched()
    s.add_request(req("a", max_new=4))
    _, outputs = run(s, FakeRunner())
    assert sum(len(o.tokens) for o in outputs) == 4
    assert outputs[-1].finish_reason == "length"


def test_a_request_cut_at_max_model_len_is_logged_and_one_at_max_new_tokens_is_not(caplog):
    """Both end as "length" (a stream cannot say more); only the cut one is a surprise to
    the client, so the server's log names it and the key."""
    s = sched(max_model_len=20)
    s.add_request(req("cut", prompt_len=16, max_new=10))
    s.add_request(req("asked", prompt_len=4, max_new=3))
    with caplog.at_level("WARNING", logger="omniflow.sched.ar_tokens"):
        _, outputs = run(s, FakeRunner())
    ends = {o.request_id: o.finish_reason for o in outputs if o.finished}
    assert ends == {"cut": "length", "asked": "length"}
    assert sum(len(o.tokens) for o in outputs if o.request_id == "cut") == 4
    [record] = caplog.records
    assert record.getMessage().startswith(
        "request cut reached max_model_len 20 (a prompt of 16 tokens and 4 frames) before its end"
    )
    assert "scheduler.max_model_len" in record.getMessage()


def test_ignore_eos_runs_to_length():
    s = sched()
    s.add_request(req("a", max_new=4, ignore_eos=True))
    _, outputs = run(s, FakeRunner(script={"a": [EOS, EOS, EOS, EOS]}))
    assert outputs[-1].finish_reason == "length"


def test_prompt_that_cannot_fit_is_refused():
    s = sched(max_model_len=16)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request(req("a", prompt_len=16))


def test_async_scheduling_plans_ahead_without_passing_max_tokens():
    s = sched()
    s.add_request(req("a", prompt_len=4, max_new=3))
    runner = FakeRunner()
    inflight = None
    planned = 0
    for _ in range(20):
        if not s.has_unfinished and inflight is None:
            break
        plan = s.schedule()
        result = runner.execute(plan) if not plan.is_empty else None
        if not plan.is_empty:
            planned += sum(1 for _ in plan.num_scheduled_tokens)
        if inflight is not None:
            s.update(*inflight)
        inflight = (plan, result) if result is not None else None
    # prompt step + 2 decode steps produce exactly 3 tokens; no 4th step is ever planned
    assert planned == 3
    assert runner.known["a"] == 4 + 3


def test_a_preempted_request_is_announced_as_held_once_per_preemption():
    """Downstream stages learn that the request is alive but paused (their receive deadline
    must wait): one non-terminal `held` notice per preemption, drained with the plan."""
    s = sched(num_kv_blocks=6, block_size=4, max_num_batched_tokens=64, max_model_len=24)
    s.add_request(req("old", prompt_len=8, max_new=8))
    s.add_request(req("new", prompt_len=8, max_new=8))
    runner = FakeRunner()
    held = []
    for _ in range(1000):
        if not s.has_unfinished:
            break
        plan = s.schedule()
        held += [o for o in s.drain_outputs() if o.held]
        s.update(plan, runner.execute(plan))
    assert s.num_preemptions >= 1
    assert [o.request_id for o in held] == ["new"] * s.num_preemptions
    assert all(not o.finished and not o.tokens for o in held)


def test_a_prompt_that_fits_beside_the_running_ones_is_never_split():
    """Budget 20 and prompts of 7: the third would have been cut to 6 tokens and finished on
    a cached prefix (the eager prefill path); it waits for the next step and goes whole."""
    s = sched(max_num_seqs=8, max_num_batched_tokens=20)
    for i in range(3):
        s.add_request(req(f"r{i}", prompt_len=7, max_new=4))
    runner = FakeRunner()
    first = s.schedule()
    assert dict(first.num_scheduled_tokens) == {"r0": 7, "r1": 7}
    s.update(first, runner.execute(first))
    second = s.schedule()
    assert dict(second.num_scheduled_tokens) == {"r0": 1, "r1": 1, "r2": 7}


def test_a_prompt_longer_than_the_room_beside_the_running_ones_is_still_split():
    """Budget 10 with one request decoding: 9 tokens of room, so a 10-token prompt could
    never go whole while it runs; it is chunked rather than left waiting forever."""
    s = sched(max_num_batched_tokens=10, max_num_seqs=4)
    s.add_request(req("a", prompt_len=6, max_new=8))
    runner = FakeRunner()
    p = s.schedule()
    s.update(p, runner.execute(p))
    s.add_request(req("b", prompt_len=10))
    p = s.schedule()
    assert dict(p.num_scheduled_tokens) == {"a": 1, "b": 9}


def test_a_context_that_would_not_fit_next_step_either_is_split_now():
    """Budget 20: w (11 tokens) is admitted, leaving 9; c (20 tokens) would have 19 next step
    beside w's decode, so waiting would only split it a step later. It is split now, as
    before, and its prompt ends in the second step."""
    s = sched(max_num_seqs=8, max_num_batched_tokens=20)
    s.add_request(req("w", prompt_len=11, max_new=4))
    s.add_request(req("c", prompt_len=20, max_new=4))
    runner = FakeRunner()
    first = s.schedule()
    assert dict(first.num_scheduled_tokens) == {"w": 11, "c": 9}
    s.update(first, runner.execute(first))
    second = s.schedule()
    assert dict(second.num_scheduled_tokens) == {"w": 1, "c": 11}
