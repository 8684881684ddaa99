"""An arrival that the next step could seat ends a running window at its next step boundary
(`core/arrivals.py`): the window's rows keep exactly their single-step codes, and the
arrival is prefilled in the next plan instead of after the whole window."""

from __future__ import annotations

import threading

import pytest

from omniflow.engine.messages import Add
from tests.factories import talker_engine
from tests.stages.test_talker_engine import collect, fixed


def run_with_cuts(cut_plans: set[int], **kw):
    """The 23-frame seeded request inline, the arrivals flag raised before each plan in
    `cut_plans` executes (as the engine thread would on an arrival)."""
    engine, proc = talker_engine(window_k=8, **kw)
    assert engine.add_request(proc.make_request(fixed("a", 23, seed=4))) == []
    execute, steps = engine.runner.execute, {}

    def spy(plan):
        if plan.step_id in cut_plans:
            engine.arrivals.notify()
        result = execute(plan)
        engine.arrivals.clear()
        if plan.window:
            steps[plan.step_id] = result.window_steps
        return result

    engine.runner.execute = spy  # type: ignore[method-assign]
    frames = collect(engine.run_until_idle())
    return frames, steps, engine


def test_a_window_cut_by_an_arrival_runs_one_step_and_keeps_the_codes():
    base, base_steps, uncut = run_with_cuts(set())
    assert max(base_steps.values()) == 8  # uncut: whole windows
    cut, steps, engine = run_with_cuts({1, 2})
    assert cut == base  # a shorter window is still exact
    assert steps[1] == 1 and steps[2] == 1  # ended at the first step boundary
    # counted (on /metrics as omniflow_window_cut_total)
    assert uncut.scheduler.gauges().windows.cut == 0
    assert engine.scheduler.gauges().windows.cut == 2
    assert len(cut["a"]) == 23
    assert engine.scheduler.kv.num_used_blocks == 0


def test_async_a_cut_window_keeps_the_codes():
    base, _, _ = run_with_cuts(set(), async_scheduling=True)
    cut, steps, _ = run_with_cuts({1, 3}, async_scheduling=True)
    assert cut == base
    assert 1 in steps.values()


def test_an_arrival_on_the_engine_thread_ends_the_running_window_and_is_seated_next():
    """The engine raises the flag when a request is sent that a seat could take: the running
    window stops after its step and the next plan prefills the arrival."""
    engine, proc = talker_engine(window_k=8)
    assert engine.add_request(proc.make_request(fixed("a", 30, seed=4))) == []
    execute, seen = engine.runner.execute, []

    def spy(plan):
        if plan.window and not any(p.window for p, _ in seen):
            engine.send(Add(proc.make_request(fixed("b", 5, seed=7))))  # arrives mid-window
        result = execute(plan)
        seen.append((plan, result))
        return result

    engine.runner.execute = spy  # type: ignore[method-assign]
    while not seen or not seen[-1][0].window:
        engine.step()
    first_window = seen[-1]
    assert first_window[1].window_steps == 1
    engine.take_arrivals()  # what the engine thread does before its next step
    engine.step()
    plan = seen[-1][0]
    assert "b" in {r.request_id for r in plan.new_requests}


def test_no_cut_when_every_seat_is_taken():
    engine, proc = talker_engine(window_k=8, max_num_seqs=1)
    assert engine.add_request(proc.make_request(fixed("a", 12, seed=4))) == []
    engine.step()  # seated
    assert not engine.scheduler.seats_free()
    engine.send(Add(proc.make_request(fixed("b", 5, seed=7))))
    assert not engine.arrivals.pending()


def test_async_an_arrival_that_cuts_a_window_is_prefilled_in_the_very_next_step():
    """Under async scheduling the step after a cut window is planned as soon as the window's
    tokens are in: the arrival is applied first and that step prefills it (before, the next
    step ran the window's rows alone and the arrival waited one more)."""
    engine, proc = talker_engine(window_k=8, async_scheduling=True, stream_decode=True)
    assert engine.add_request(proc.make_request(fixed("a", 30, seed=4))) == []
    execute, seen = engine.runner.execute, []

    def spy(plan):
        if plan.window and not any(p.window for p in seen):
            engine.send(Add(proc.make_request(fixed("b", 5, seed=7))))  # arrives mid-window
        seen.append(plan)
        return execute(plan)

    engine.runner.execute = spy  # type: ignore[method-assign]
    outputs = []
    while len(seen) < 2 or not any(p.window for p in seen[:-1]):
        outputs += engine.step()  # no inbox drain between steps: the step takes the arrival
    window = next(i for i, p in enumerate(seen) if p.window)
    assert "b" in {r.request_id for r in seen[window + 1].new_requests}
    outputs += engine.run_until_idle()
    assert {o.request_id for o in outputs if o.finished} == {"a", "b"}
    alone = {}
    for rid, frames, seed in (("a", 30, 4), ("b", 5, 7)):  # each request's codes, by itself
        solo, proc = talker_engine(async_scheduling=True, stream_decode=True)
        solo.add_request(proc.make_request(fixed(rid, frames, seed=seed)))
        alone |= collect(solo.run_until_idle())
    assert collect(outputs) == alone


def test_a_window_whose_rows_all_stop_where_an_arrival_lands_is_not_counted_as_cut():
    """The EOS-prone talker ends its request in a window's third step: an arrival flagged at
    that step boundary changes nothing (the window ends there anyway), so it is no cut; at
    the boundary before, it is one."""
    from tests.stages.test_window_overlap import traced_engine

    def run(flag_at: int) -> tuple[int, int]:
        engine, _, _ = traced_engine(8, [("a", 3, False, "Hello there.", 40)])
        runner, execute = engine.runner, engine.runner.execute
        steps = []

        def spy(plan):
            if plan.window:
                calls = iter(range(1, 100))
                runner.arrivals.pending = lambda: next(calls) == flag_at
            result = execute(plan)
            if plan.window:
                steps.append(result.window_steps)
            return result

        runner.execute = spy  # type: ignore[method-assign]
        engine.run_until_idle()
        return steps[0], engine.scheduler.gauges().windows.cut

    assert run(3) == (3, 0)  # its stop token at step 3: the window ended there regardless
    assert run(2) == (2, 1)  # flagged a step earlier: cut


def held_window(async_scheduling: bool = True):
    """An engine with "a" running whose first window, once submitted, waits at a gate on
    the runner's thread: the engine thread can read its inbox meanwhile, as it does while a
    window is submitted and not yet run. Returns (engine, processor, gate, steps per window)."""
    engine, proc = talker_engine(window_k=8, async_scheduling=async_scheduling)
    assert engine.add_request(proc.make_request(fixed("a", 30, seed=4))) == []
    execute, schedule = engine.runner.execute, engine.scheduler.schedule
    planned, windows = [], []
    gate, started = threading.Event(), threading.Event()

    def plan():
        out = schedule()
        planned.append(out)
        return out

    def spy(p):
        if p.window and not windows and not started.is_set():
            started.set()
            assert gate.wait(30)
        result = execute(p)
        if p.window:
            windows.append(result.window_steps)
        return result

    engine.scheduler.schedule = plan  # type: ignore[method-assign]
    engine.runner.execute = spy  # type: ignore[method-assign]
    if async_scheduling:
        while not any(p.window for p in planned):
            engine.step()
        assert started.wait(30) and engine.window_in_flight
    return engine, proc, gate, windows


def test_async_an_arrival_taken_while_a_window_waits_to_run_still_ends_it():
    """Under async scheduling the engine thread reads its inbox while the next window is
    already submitted: an arrival it takes there is seated in the plan after that window.
    Reading the inbox clears the arrivals flag, so the flag is raised again for what it took
    that a seat could take: the window ends at its first step boundary, not after all its
    steps (before, such an arrival waited the whole window)."""
    engine, proc, gate, windows = held_window()
    engine.send(Add(proc.make_request(fixed("b", 5, seed=7))))  # arrives: the flag is raised
    engine.take_arrivals()  # the engine thread reads its inbox before its next step
    assert engine.arrivals.pending()  # b waits for a seat the next step can give it
    gate.set()
    outputs = engine.step()  # plans b's step, then waits for the window
    assert windows[0] == 1  # the window ended at its first step boundary
    outputs += engine.run_until_idle()
    assert {o.request_id for o in outputs if o.finished} == {"a", "b"}


@pytest.mark.parametrize("aborted", [False, True])
def test_an_arrival_no_seat_will_take_leaves_the_window_whole(aborted):
    """Refused at once (a duplicate id) or aborted in the same inbox read: nobody waits, so
    the flag stays down and the window in flight runs all its steps."""
    engine, proc, gate, windows = held_window()
    rid = "b" if aborted else "a"  # "a" again: refused as a duplicate
    engine.send(Add(proc.make_request(fixed(rid, 5, seed=7))))
    if aborted:
        engine.abort("b")
    engine.take_arrivals()
    assert not engine.arrivals.pending()
    gate.set()
    engine.run_until_idle()
    assert windows[0] == 8


def test_sync_reading_the_inbox_raises_no_flag():
    """Without async scheduling nothing is in flight while the inbox is read: the next plan
    seats the arrival itself, so the flag stays down and cuts nothing later."""
    engine, proc = talker_engine(window_k=8)
    assert engine.add_request(proc.make_request(fixed("a", 30, seed=4))) == []
    engine.step()  # a's prefill
    engine.send(Add(proc.make_request(fixed("b", 5, seed=7))))
    engine.take_arrivals()
    assert not engine.arrivals.pending()
    engine.step()
    assert engine.scheduler.requests["b"].seated_at is not None  # seated by that plan
