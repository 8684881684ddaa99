"""Windows that admit (`window_admits`) on the tiny model: a window opened on a step that
prefills new prompts beside running requests gives every request the codes (and, with stream
decode, the PCM) of single steps, in fewer steps and decoder passes."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import defaultdict

import numpy as np
import pytest

from omniflow.core.output import StageOutput
from tests.factories import (
    EOS,
    FirstAudio,
    build,
    eos_bundle,
    speech,
    stage_stats,
    talker_engine,
)
from tests.stages.test_talker_engine import collect, fixed, preemptible

ARRIVALS = {
    0: [fixed("x", 20, seed=3), fixed("y", 14, seed=4, text="Another one.")],
    3: [fixed("late1", 9, seed=20), fixed("late2", 5, seed=22, text="Yes.")],
    5: [fixed("late3", 7, seed=21, text="A third arrival, longer.")],
}
"""Requests by the engine step before which they arrive: two waves join running ones."""


class Phases:
    """Counts the runner's phases by name (decoder passes are `audio`)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = defaultdict(int)

    @contextlib.contextmanager
    def phase(self, stage: str, name: str):
        self.calls[name] += 1
        yield


def staggered(arrivals=None, **engine_kw) -> tuple[list[StageOutput], object, Phases]:
    """Runs the requests, each wave added before its engine step; (outputs, engine, phases)."""
    arrivals = ARRIVALS if arrivals is None else arrivals
    engine, proc = talker_engine(**engine_kw)
    phases = Phases()
    engine.runner.set_timer(phases, "talker")
    return drive(engine, proc, arrivals), engine, phases


def drive(engine, proc, arrivals) -> list[StageOutput]:
    """Adds each wave before its engine step, runs to idle; every output error-free."""
    outputs: list[StageOutput] = []
    for i in range(max(arrivals) + 1):
        for r in arrivals.get(i, []):
            assert engine.add_request(proc.make_request(r)) == []
        outputs.extend(engine.step())
    outputs.extend(engine.run_until_idle())
    assert all(o.error is None for o in outputs)
    return outputs


@pytest.mark.parametrize(
    ("async_scheduling", "stream_decode"), [(False, False), (True, False), (True, True)]
)
def test_admitting_windows_give_the_single_step_codes(async_scheduling, stream_decode):
    """(True, True) is the fused pipeline's shipped setup: there the engine plans the next
    step while a window (and its audio) is in flight, so arrivals would always find the
    running rows fenced; they are held for the plan after the window's update instead."""
    kw = dict(async_scheduling=async_scheduling, stream_decode=stream_decode)
    base, _, _ = staggered(**kw)
    outs, engine, phases = staggered(**kw, window_k=4, window_admits=True)
    assert collect(outs) == collect(base)
    stats = engine.scheduler.window_stats
    assert stats.admitting_windows >= 2  # both waves joined a window of the running rows
    assert phases.calls["admitting_window"] == stats.admitting_windows
    assert engine.scheduler.kv.num_used_blocks == 0


def test_admitting_saves_the_steps_that_arrivals_cost():
    """Without admits every wave costs a single step beside the running rows."""
    _, plain, _ = staggered(window_k=4)
    _, admits, _ = staggered(window_k=4, window_admits=True)
    assert admits.num_steps < plain.num_steps
    assert plain.scheduler.window_stats.admitting_windows == 0
    assert plain.scheduler.window_stats.refusals["new_request"] >= 3


def pcm(outputs: list[StageOutput]) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    for o in outputs:
        if o.audio is not None:
            parts[o.request_id].append(o.audio)
    return {rid: np.concatenate(p) for rid, p in parts.items()}


def test_an_admitting_window_decodes_its_audio_in_one_pass():
    """Stream decode: the same PCM as single steps (within one 16-bit step: a pass over
    several frames rounds differently from one pass per frame), and an admitting window
    makes one decoder pass, its mixed first step's frame included."""
    base, _, _ = staggered(stream_decode=True)
    outs, engine, phases = staggered(stream_decode=True, window_k=4, window_admits=True)
    want, got = pcm(base), pcm(outs)
    assert set(got) == set(want)
    for rid, frames in collect(base).items():
        assert got[rid].shape == want[rid].shape == (len(frames) * 1920,)
        np.testing.assert_allclose(got[rid], want[rid], rtol=0, atol=1 / 32768)
    assert engine.scheduler.window_stats.admitting_windows >= 2
    # one decoder pass per executed step, a window (admitting or not) counted once
    steps = sum(phases.calls[k] for k in ("decode_step", "mixed_step", "admitting_window"))
    assert phases.calls["audio"] == steps


def test_an_arrival_that_stops_at_its_first_token_leaves_the_window_there():
    """'e' may stop at once (min_new_tokens 0 on the EOS-biased model): it draws EOS in the
    admitting window's mixed first step and leaves; the running request goes on, and both
    match single steps."""
    arrivals = {0: [speech("a", max_new_tokens=12, seed=1, ignore_eos=True)], 2: ["e"]}
    runs = []
    results = []
    for kw in ({}, {"window_k": 4, "window_admits": True}):
        engine, proc = eos_talker(**kw)
        execute = engine.runner.execute

        def spy(plan, execute=execute):
            result = execute(plan)
            results.append(result)
            return result

        engine.runner.execute = spy  # type: ignore[method-assign]
        outputs: list[StageOutput] = []
        for i in range(3):
            for r in arrivals.get(i, []):
                if r == "e":
                    request = proc.make_request(speech("e", max_new_tokens=12, seed=2))
                    request.sampling = dataclasses.replace(request.sampling, min_new_tokens=0)
                else:
                    request = proc.make_request(r)
                engine.add_request(request)
            outputs.extend(engine.step())
        outputs.extend(engine.run_until_idle())
        runs.append((collect(outputs), outputs, engine))
    (base, _, _), (got, outs, engine) = runs
    assert got == base
    assert [f[0] for f in got["e"]] == [EOS]
    assert next(o for o in outs if o.request_id == "e").finish_reason == "stop"
    assert engine.scheduler.window_stats.admitting_windows == 1
    assert engine.scheduler.kv.num_used_blocks == 0
    # the runner itself left the window at e's EOS: nothing computed or returned after it
    admitting = [r for r in results if "e" in r.outputs and r.window_steps > 1]
    assert len(admitting) == 1
    assert admitting[0].outputs["e"].tokens == (EOS,)
    assert len(admitting[0].outputs["a"].tokens) == admitting[0].window_steps == 4


def eos_talker(**kw):
    """talker_engine on the EOS-biased tiny model (EOS wins every draw it is allowed in)."""
    return talker_engine(bundle=eos_bundle(), **kw)


def test_a_preempted_request_resumes_into_a_window_with_the_same_codes():
    """A squeezed pool preempts a request; its recompute (prompt and the frames it had) is
    admitted into a window beside the running rows, and every code equals the calm run's."""
    arrivals = {i: [preemptible(f"r{i}", seed=i)] for i in range(3)}
    calm, _, _ = staggered(arrivals)
    squeezed_kw = dict(num_kv_blocks=12, block_size=4, max_model_len=48)
    engine, proc = talker_engine(window_k=4, window_admits=True, **squeezed_kw)
    resumed = []
    execute = engine.runner.execute

    def spy(plan):
        if plan.window:  # a new request with outputs already is a preempted one resuming
            resumed.extend(d.request_id for d in plan.new_requests if d.output_tokens)
        return execute(plan)

    engine.runner.execute = spy  # type: ignore[method-assign]
    outputs = drive(engine, proc, arrivals)
    assert engine.scheduler.num_preemptions > 0 and resumed
    assert collect(outputs) == collect(calm)
    assert engine.scheduler.kv.num_used_blocks == 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_admitting_window_refused_at_run_time_runs_the_exact_mixed_step(async_scheduling):
    """The runner's gate refuses every window that admits: its single step must still
    prefill each new prompt whole (not one token of it) and decode one token for the
    running rows, and the scheduler's reconcile must agree, so the codes stay the K=0 ones
    and no block is left behind."""
    base, _, _ = staggered(async_scheduling=async_scheduling)
    engine, proc = talker_engine(async_scheduling=async_scheduling, window_k=4, window_admits=True)
    runner = engine.runner
    gate = runner._window_refusal
    refused = []

    def refuse_admitting(plan):
        if plan.new_requests:
            refused.append(plan.step_id)
            return "plan_mismatch"
        return gate(plan)

    runner._window_refusal = refuse_admitting  # type: ignore[method-assign]
    outputs = drive(engine, proc, ARRIVALS)
    assert len(refused) >= 2
    assert engine.scheduler.window_stats.refusals["plan_mismatch"] == len(refused)
    assert collect(outputs) == collect(base)
    assert engine.scheduler.kv.num_used_blocks == 0


def test_the_served_pipeline_admits_when_its_stage_says_so():
    """`pipeline.stages.talker.window_admits` reaches the served talker's scheduler (async
    scheduling, the fused pipeline's default): a request submitted while another decodes
    joins a window, and finishes whole."""
    orch = build(
        "qwen3_tts_fused",
        "pipeline.stages.talker.window_k=4",
        "pipeline.stages.talker.window_admits=true",
        "pipeline.stages.talker.playback_margin_ms=null",  # fixed windows: not by the clock
    )
    try:
        first, second = FirstAudio(), FirstAudio()
        orch.submit(speech("long", max_new_tokens=150, ignore_eos=True, seed=1), first)
        assert first.started.wait(60)
        orch.submit(speech("late", max_new_tokens=6, ignore_eos=True, seed=2), second)
        assert second.wait().pcm.shape == (6 * 1920,)
        assert stage_stats(orch, "talker").windows.admitting >= 1
        assert first.wait().pcm.shape == (150 * 1920,)
    finally:
        orch.stop()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_admitting_window_decodes_its_audio_in_chunks(async_scheduling):
    """`audio_chunk_frames` 2 in windows of 4: the mixed first step counts as the first
    frame of the window's first chunk (every pass but a request's last takes 2 frames), and
    the PCM is the single steps' within one 16-bit step."""
    base, _, _ = staggered(stream_decode=True)
    engine, proc = talker_engine(
        stream_decode=True, window_k=4, window_admits=True, async_scheduling=async_scheduling
    )
    engine.runner.audio_chunk_frames = 2
    passes: list[int] = []
    queue_audio = engine.runner.model.queue_audio

    def spy(steps):
        passes.append(len(steps))
        return queue_audio(steps)

    engine.runner.model.queue_audio = spy  # type: ignore[method-assign]
    outputs = drive(engine, proc, ARRIVALS)
    assert engine.scheduler.window_stats.admitting_windows >= 2
    assert collect(outputs) == collect(base)
    want, got = pcm(base), pcm(outputs)
    for rid in want:
        np.testing.assert_allclose(got[rid], want[rid], rtol=0, atol=1 / 32768)
    assert max(passes) == 2 and passes.count(2) > passes.count(1)


def test_admitting_windows_through_the_graph_paths_give_the_eager_codes():
    """The talker's decode-graph and the predictor's frame-graph paths (run without capture
    on the CPU: the bucket padding and wiring CUDA replays) in admitting windows."""
    base, _, _ = staggered()
    outs, engine, _ = staggered(
        decode_graphs=True, frame_graphs=True, window_k=4, window_admits=True
    )
    assert engine.runner.model.decode_graphs is not None
    assert engine.scheduler.window_stats.admitting_windows >= 2
    assert collect(outs) == collect(base)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_windows_stay_open_while_requests_queue_for_a_seat(async_scheduling):
    """Four requests, two seats: with `window_admits` the two queued ones do not close the
    running ones' windows (without it every step while they queue is single), and each
    request's codes are the single steps' codes."""
    reqs = {0: [fixed(f"q{i}", 6 + 4 * i, seed=i, text=f"Queue {i}.") for i in range(4)]}
    kw = dict(async_scheduling=async_scheduling, max_num_seqs=2)
    base, _, _ = staggered(reqs, **kw)
    _, plain, _ = staggered(reqs, **kw, window_k=4)
    outs, admits, _ = staggered(reqs, **kw, window_k=4, window_admits=True)
    assert collect(outs) == collect(base)
    assert plain.scheduler.window_stats.refusals["waiting"] > 0
    assert admits.scheduler.window_stats.refusals["waiting"] == 0
    assert admits.num_steps < plain.num_steps
