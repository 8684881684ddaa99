"""Window planning, the fence and reconcile on the real ARScheduler."""

from __future__ import annotations

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


# ------------------------------------------------------------------ windows and arrivals


def a_decoding(s, runner: WindowRunner, **a) -> None:
    """'a' (8 prompt tokens, 20 frames unless `a` says otherwise) prefilled: it decodes next."""
    s.add_request(req("a", **{"prompt_len": 8, "max_new": 20, **a}))
    step(s, runner)


def test_an_arrival_makes_a_single_step():
    """A new prompt beside a decoding request: a single mixed step, never a window (its
    first audio comes after one step)."""
    s = sched()
    s.window_k = 4
    r = WindowRunner()
    a_decoding(s, r)
    s.add_request(req("b", prompt_len=6, max_new=20))
    p, _ = step(s, r)
    assert not p.window and dict(p.num_scheduled_tokens) == {"a": 1, "b": 6}
    assert s.window_stats.refusals["new_request"] == 2  # a's first step, then b's


def test_a_split_prompt_is_refused_as_new_then_as_prefill():
    s = sched(max_num_batched_tokens=16)
    s.window_k = 4
    s.add_request(req("b", prompt_len=24, max_new=30))
    r = WindowRunner()
    step(s, r)  # b's first 16 of a split prompt: `new_request`
    p, _ = step(s, r)  # its last 8: b is not new
    assert not p.window
    assert dict(s.window_stats.refusals) == {"new_request": 1, "prefill": 1}


def test_an_arrival_during_a_window_in_flight_is_prefilled_at_once():
    """Async scheduling plans the next step before a window's update: an arrival is
    prefilled alone beside the fenced window, and decodes in the next window with it."""
    s = sched()
    s.window_k = 4
    r = WindowRunner()
    a_decoding(s, r, max_new=30)
    window = s.schedule()
    assert dict(window.window) == {"a": 4}
    s.add_request(req("b", prompt_len=6, max_new=30))
    during = s.schedule()  # a is fenced
    assert dict(during.num_scheduled_tokens) == {"b": 6}
    s.update(window, r.execute(window))
    s.update(during, r.execute(during))
    after = s.schedule()
    assert dict(after.window) == {"a": 4, "b": 4}  # b decodes: an ordinary window
    assert dict(after.num_scheduled_tokens) == {"a": 4, "b": 4}


def test_a_queue_beyond_the_seats_closes_windows():
    """Two seats, three requests: c waits for a seat, and the waiting queue refuses every
    window (the gate's rule), so c is admitted at the first step a seat frees."""
    s = sched(max_num_seqs=2)
    s.window_k = 4
    s.add_request(req("a", prompt_len=8, max_new=6))
    s.add_request(req("b", prompt_len=8, max_new=30))
    s.add_request(req("c", prompt_len=8, max_new=30))
    r = WindowRunner()
    step(s, r)  # a and b prefilled; c waits for a seat
    p, _ = step(s, r)
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
