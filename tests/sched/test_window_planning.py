"""Window planning, the fence and reconcile on the real ARScheduler."""

from __future__ import annotations

import pytest

from omniflow.core.step import RequestStepOutput, StepPlan, StepResult
from tests.sched.test_ar_scheduler import EOS, FakeRunner, req, sched


class WindowRunner(FakeRunner):
    """FakeRunner that replays window plans (k tokens, fewer on EOS) or refuses them."""

    def __init__(self, script=None, refuse: bool = False) -> None:
        super().__init__(script)
        self.refuse = refuse

    def execute(self, plan: StepPlan) -> StepResult:
        if not plan.window:
            return super().execute(plan)
        for d in plan.new_requests:
            self.known[d.request_id] = d.prompt_len + len(d.output_tokens)
            self.computed[d.request_id] = d.num_computed_tokens
        for c in plan.cached_requests:
            self.computed[c.request_id] = c.num_computed_tokens
        outs = {}
        steps = 0
        for rid, k in plan.window.items():
            # A row the window admits first computes the rest of its known tokens.
            self.computed[rid] += plan.num_scheduled_tokens[rid] - k
            assert self.computed[rid] + 1 == self.known[rid]  # its first step samples
            n = 1 if self.refuse else k
            toks = []
            for _ in range(n):
                script = self.script.get(rid)
                tok = script.pop(0) if script else next(self.counter) % 50
                toks.append(tok)
                self.computed[rid] += 1
                self.known[rid] += 1
                if tok == EOS:
                    break
            steps = max(steps, len(toks))
            outs[rid] = RequestStepOutput(tokens=tuple(toks), frames=(None,) * len(toks))
        return StepResult(
            plan.step_id, outs, window_steps=steps, window_refusal="test" if self.refuse else None
        )


def step(s, runner):
    plan = s.schedule()
    return plan, s.update(plan, runner.execute(plan))


def test_a_window_opens_only_for_decode_with_nothing_waiting():
    s = sched(max_num_seqs=1)
    s.window_k = 4
    s.add_request(req("a", prompt_len=8, max_new=20))
    s.add_request(req("b", prompt_len=8, max_new=2))
    r = WindowRunner()
    p, _ = step(s, r)  # prefill of a: new request, and the last prefill token
    assert not p.window
    p, _ = step(s, r)  # a decodes, but b is waiting (max_num_seqs=1)
    assert not p.window
    assert dict(s.window_stats.refusals) == {"waiting": 2}  # one per step that b waited
    assert s.window_stats.planned_windows == 0
    s.finish("b", "abort")
    p, _ = step(s, r)
    assert dict(p.window) == {"a": 4} and dict(p.num_scheduled_tokens) == {"a": 4}
    assert s.window_stats.planned_windows == 1


def test_the_last_prefill_token_never_opens_a_window():
    s = sched(max_num_batched_tokens=8)
    s.window_k = 4
    s.add_request(req("a", prompt_len=16, max_new=10))
    r = WindowRunner()
    p1, _ = step(s, r)  # tokens 0..7, new request
    p2, _ = step(s, r)  # tokens 8..15: the last prefill chunk samples the first token
    assert not p1.window and not p2.window
    assert s.window_stats.refusals["prefill"] == 1
    p3, _ = step(s, r)
    assert dict(p3.window) == {"a": 4}


def test_k_is_clamped_to_the_remaining_budget_per_request():
    s = sched(max_model_len=12)
    s.window_k = 8
    s.add_request(req("short", prompt_len=4, max_new=3))
    s.add_request(req("long", prompt_len=4, max_new=50))
    r = WindowRunner()
    step(s, r)  # prefill both, first token each
    p, outs = step(s, r)
    # short: 3 - 1 generated = 2; long: max_model_len 12 - 5 tokens = 7
    assert dict(p.window) == {"short": 2, "long": 7}
    # each ran exactly its clamped k and ended at its own limit, inside this one window
    ends = {o.request_id: (len(o.tokens), o.finish_reason) for o in outs}
    assert ends == {"short": (2, "length"), "long": (7, "length")}
    assert not s.requests and s.kv.num_used_blocks == 0
    assert s.window_stats.executed_steps == 7


def test_kv_shortage_falls_back_to_one_step_with_consistent_tables():
    # 3 blocks of 4: the prompt (8) and the next token fit, a window of 8 would need 4 blocks.
    s = sched(num_kv_blocks=3, block_size=4, max_model_len=20)
    s.window_k = 8
    s.add_request(req("a", prompt_len=8, max_new=10))
    r = WindowRunner()
    step(s, r)
    p, outs = step(s, r)
    assert not p.window and dict(p.num_scheduled_tokens) == {"a": 1}
    assert s.window_stats.refusals["kv"] == 1
    a = s.requests["a"]
    assert len(s.kv.block_ids("a")) == 3 == s.kv.blocks_for(a.num_computed_tokens + 1)
    assert len(outs[0].tokens) == 1


def test_the_fence_holds_a_request_until_its_window_is_reconciled():
    s = sched()
    s.window_k = 4
    s.add_request(req("a", prompt_len=4, max_new=30))
    r = WindowRunner()
    step(s, r)
    p = s.schedule()
    assert dict(p.window) == {"a": 4}
    again = s.schedule()  # async: planned before update(p)
    assert again.is_empty  # fenced: nothing planned against optimistic positions
    s.update(p, r.execute(p))
    s.update(again, r.execute(again))
    nxt = s.schedule()
    assert "a" in nxt.num_scheduled_tokens


def test_shortfall_rolls_back_and_frees_unused_slots():
    s = sched(block_size=2)
    s.window_k = 8
    s.add_request(req("a", prompt_len=4, max_new=40))
    r = WindowRunner(refuse=True)
    step(s, r)
    a = s.requests["a"]
    before = a.num_computed_tokens
    p, outs = step(s, r)
    assert dict(p.window) == {"a": 8}
    assert len(outs[0].tokens) == 1  # the runner refused and ran one step
    assert a.num_computed_tokens == before + 1
    assert a.num_placeholders == 0
    assert len(s.kv.block_ids("a")) == s.kv.blocks_for(a.num_computed_tokens)
    assert s.window_stats.refusals["test"] == 1


def test_eos_inside_a_window_ends_the_request_and_frees_everything():
    s = sched()
    s.window_k = 8
    s.add_request(req("a", prompt_len=4, max_new=40))
    r = WindowRunner(script={"a": [1, 2, 3, EOS]})
    step(s, r)
    p, outs = step(s, r)
    assert p.window and outs[-1].finished and outs[-1].finish_reason == "stop"
    assert outs[-1].tokens == (2, 3, EOS)
    assert s.kv.num_used_blocks == 0
    assert s.window_stats.executed_windows == 1 and s.window_stats.executed_steps == 3


# ------------------------------------------------------------- windows that admit (window_admits)


def admitting_sched(**kw):
    s = sched(**kw)
    s.window_k = 4
    s.window_admits = True
    return s


def a_decoding(s, runner: WindowRunner, **a) -> None:
    """'a' (8 prompt tokens, 20 frames unless `a` says otherwise) prefilled: it decodes next."""
    s.add_request(req("a", **{"prompt_len": 8, "max_new": 20, **a}))
    step(s, runner)


def test_a_window_admits_a_new_prompt_beside_a_decoding_request():
    s = admitting_sched()
    s.add_request(req("a", prompt_len=8, max_new=20))
    r = WindowRunner()
    p, _ = step(s, r)  # a alone: arrivals alone stay a single step (first audio at once)
    assert not p.window and s.window_stats.refusals["new_request"] == 1
    s.add_request(req("b", prompt_len=6, max_new=20))
    p = s.schedule()
    # b: its whole prompt in the first step, then 3 decode steps; a: 4 decode steps
    assert dict(p.window) == {"a": 4, "b": 4}
    assert dict(p.num_scheduled_tokens) == {"a": 4, "b": 6 + 3}
    b = s.requests["b"]
    assert b.num_placeholders == 4 and b.num_computed_tokens == 9 == b.num_tokens - 1
    assert len(s.kv.block_ids("b")) == s.kv.blocks_for(9)
    outs = s.update(p, r.execute(p))
    assert {o.request_id: len(o.tokens) for o in outs} == {"a": 4, "b": 4}
    assert b.num_placeholders == 0 and b.num_computed_tokens + 1 == b.num_tokens == 10
    assert s.window_stats.admitting_windows == 1 and s.window_stats.planned_windows == 1


def test_without_window_admits_an_arrival_makes_a_single_step():
    s = sched()
    s.window_k = 4
    r = WindowRunner()
    a_decoding(s, r)
    s.add_request(req("b", prompt_len=6, max_new=20))
    p, _ = step(s, r)
    assert not p.window and dict(p.num_scheduled_tokens) == {"a": 1, "b": 6}
    assert s.window_stats.admitting_windows == 0


def test_a_prompt_split_across_steps_is_never_admitted():
    """b's prompt (40) exceeds the step's budget: its first chunk samples nothing, so the
    step stays single for everyone; its last chunk is admitted once it fits whole."""
    s = admitting_sched(max_num_batched_tokens=32)
    r = WindowRunner()
    a_decoding(s, r, max_new=30)
    s.add_request(req("b", prompt_len=40, max_new=30))
    p, _ = step(s, r)
    assert not p.window and dict(p.num_scheduled_tokens) == {"a": 1, "b": 31}
    assert s.window_stats.refusals["prefill"] == 1
    p, _ = step(s, r)  # b's last 9 tokens, whole: admitted
    assert dict(p.window) == {"a": 4, "b": 4}
    assert dict(p.num_scheduled_tokens) == {"a": 4, "b": 9 + 3}


def test_an_admitted_request_that_stops_at_its_first_token_frees_everything():
    s = admitting_sched()
    r = WindowRunner(script={"b": [EOS]})
    a_decoding(s, r)
    s.add_request(req("b", prompt_len=6, max_new=20, min_new_tokens=0))
    p, outs = step(s, r)
    assert dict(p.window) == {"a": 4, "b": 4}
    ends = {o.request_id: (o.tokens, o.finish_reason) for o in outs}
    assert ends["b"] == ((EOS,), "stop") and len(ends["a"][0]) == 4
    assert "b" not in s.requests and s.kv.block_ids("b") == ()
    assert s.kv.num_used_blocks == s.kv.blocks_for(s.requests["a"].num_computed_tokens)


def test_a_refused_admitting_window_keeps_the_prefill_and_one_token():
    s = admitting_sched(block_size=2)
    r = WindowRunner(refuse=True)
    a_decoding(s, r)
    s.add_request(req("b", prompt_len=6, max_new=20))
    a = s.requests["a"]
    a_before = a.num_computed_tokens
    p, outs = step(s, r)
    assert dict(p.window) == {"a": 4, "b": 4}
    b = s.requests["b"]
    assert {o.request_id: len(o.tokens) for o in outs} == {"a": 1, "b": 1}
    assert a.num_computed_tokens == a_before + 1 and b.num_computed_tokens == 6
    assert b.num_placeholders == 0 == a.num_placeholders
    for x in (a, b):
        assert len(s.kv.block_ids(x.request_id)) == s.kv.blocks_for(x.num_computed_tokens)


def test_a_one_token_last_chunk_is_admitted_and_counted():
    s = admitting_sched(max_num_batched_tokens=32)
    r = WindowRunner()
    a_decoding(s, r, max_new=30)
    s.add_request(req("b", prompt_len=32, max_new=30))
    p, _ = step(s, r)  # a's token and b's first 31
    assert dict(p.num_scheduled_tokens) == {"a": 1, "b": 31} and not p.window
    p, _ = step(s, r)  # b's last prompt token, admitted
    assert dict(p.window) == {"a": 4, "b": 4}
    assert dict(p.num_scheduled_tokens) == {"a": 4, "b": 1 + 3}
    assert s.window_stats.admitting_windows == 1


def test_a_lone_last_chunk_is_refused_as_prefill_not_as_new():
    s = admitting_sched(max_num_batched_tokens=16)
    s.add_request(req("b", prompt_len=24, max_new=30))
    r = WindowRunner()
    step(s, r)  # b's first 16 of a split prompt: `prefill`
    p, _ = step(s, r)  # its last 8, alone: nothing to admit it beside, and b is not new
    assert not p.window
    assert dict(s.window_stats.refusals) == {"prefill": 2}


@pytest.mark.parametrize("admits", [False, True])
def test_arrivals_wait_for_the_window_in_flight_only_when_it_admits(admits):
    """Async scheduling plans the next step before a window's update: with `window_admits`
    an arrival is held back while every running request is fenced (the plan is empty), and
    the plan after the update admits it beside them; without, it is prefilled alone."""
    s = sched()
    s.window_k = 4
    s.window_admits = admits
    r = WindowRunner()
    a_decoding(s, r, max_new=30)
    window = s.schedule()
    assert dict(window.window) == {"a": 4}
    s.add_request(req("b", prompt_len=6, max_new=30))
    during = s.schedule()  # a is fenced
    assert dict(during.num_scheduled_tokens) == ({} if admits else {"b": 6})
    s.update(window, r.execute(window))
    s.update(during, r.execute(during))
    after = s.schedule()
    if admits:
        assert dict(after.window) == {"a": 4, "b": 4}
        assert dict(after.num_scheduled_tokens) == {"a": 4, "b": 6 + 3}
    else:
        assert dict(after.window) == {"a": 4, "b": 4}  # b decodes: an ordinary window
        assert dict(after.num_scheduled_tokens) == {"a": 4, "b": 4}


def test_a_paused_request_neither_holds_arrivals_nor_lets_them_past_the_window():
    """Held while every *unpaused* running request is fenced: with 'a' in its window and
    'c' paused (not stepping), 'b' waits for a's window; with 'a' paused too, nothing is
    stepping and 'b' is planned at once."""
    s = admitting_sched()
    for rid in ("a", "c"):
        s.add_request(req(rid, prompt_len=8, max_new=30))
    r = WindowRunner()
    step(s, r)
    s.pause("c")
    window = s.schedule()
    assert dict(window.window) == {"a": 4}
    s.add_request(req("b", prompt_len=6, max_new=30))
    assert s.schedule().is_empty  # b held for a's window
    s.update(window, r.execute(window))
    s.pause("a")
    p = s.schedule()
    assert dict(p.num_scheduled_tokens) == {"b": 6}


@pytest.mark.parametrize("admits", [False, True])
def test_a_queue_beyond_the_seats_closes_windows_only_without_admits(admits):
    """Two seats, three requests: c waits for a seat. Without `window_admits` the waiting
    queue refuses every window (the gate's rule); with it, c could not enter before a or b
    ends anyway, so the window opens, and c is admitted when a seat frees."""
    s = sched(max_num_seqs=2)
    s.window_k = 4
    s.window_admits = admits
    s.add_request(req("a", prompt_len=8, max_new=6))
    s.add_request(req("b", prompt_len=8, max_new=30))
    s.add_request(req("c", prompt_len=8, max_new=30))
    r = WindowRunner()
    step(s, r)  # a and b prefilled; c waits for a seat
    p, _ = step(s, r)
    if admits:
        assert dict(p.window) == {"a": 4, "b": 4}
    else:
        assert not p.window and s.window_stats.refusals["waiting"] == 2
    plans, _ = run_plans(s, r)
    admitted = next(q for q in plans if "c" in q.num_scheduled_tokens)
    assert admitted.num_scheduled_tokens["c"] >= 8  # c's prompt, once a finished
    assert not s.requests and s.kv.num_used_blocks == 0


def run_plans(s, r):
    plans, outputs = [], []
    while s.has_unfinished:
        plan, outs = step(s, r)
        plans.append(plan)
        outputs.extend(outs)
    return plans, outputs
