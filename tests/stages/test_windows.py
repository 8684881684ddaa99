"""Multi-step windows end to end on the tiny model: exactly the single-step tokens and audio."""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import numpy as np
import pytest
import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.core.step import StepPlan, StepResult
from omniflow.engine.stage_engine import StageEngine
from omniflow.models.qwen3_tts.ar_model import build_ar_model
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.sched.ar import ARScheduler
from omniflow.sched.playback import PlaybackClock
from omniflow.worker.ar_runner import ARModelRunner
from tests.factories import EOS, Collector, build, eos_bundle, speech, stage_stats, talker_engine
from tests.stages.test_talker_engine import fixed, generate, preemptible


@functools.cache
def single_step_codes(async_scheduling: bool):
    """One 23-frame request's window_k=0 codes (shared by the K cases of a mode)."""
    return generate([fixed("a", 23, seed=4)], async_scheduling=async_scheduling)[0]


@pytest.mark.parametrize("k", [2, 5, 12])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_window_codes_equal_single_step_at_concurrency_1(k, async_scheduling):
    req = [fixed("a", 23, seed=4)]
    base = single_step_codes(async_scheduling)
    win, _, engine = generate(req, async_scheduling=async_scheduling, window_k=k)
    assert win == base
    st = engine.scheduler.window_stats
    assert st.planned_windows > 0 and st.executed_windows > 0
    assert st.executed_steps > st.executed_windows  # several steps per window
    assert engine.scheduler.kv.num_used_blocks == 0


def test_window_codes_equal_single_step_for_same_length_requests():
    reqs = [fixed(f"r{i}", 17, seed=i, text=f"Same length {i}.") for i in range(4)]
    base, _, _ = generate(reqs)
    win, _, engine = generate(reqs, window_k=8)
    assert win == base
    assert engine.scheduler.window_stats.executed_windows > 0


def test_windows_respect_max_new_tokens_exactly():
    for n in (1, 2, 5, 9):
        frames, outputs, engine = generate([fixed("a", n)], window_k=8)
        assert len(frames["a"]) == n and outputs[-1].finish_reason == "length"
        w = engine.stats().windows
        if n > 2:  # the prefill samples token 1; one window (k clamped to n - 1) does the rest
            assert (w.planned, w.executed, w.steps) == (1, 1, n - 1)
        else:  # at most one token left after the prefill: never a window
            assert (w.planned, w.executed, w.steps) == (0, 0, 0)


def test_windows_with_preemption_keep_the_codes():
    reqs = [preemptible(f"r{i}", seed=i) for i in range(3)]
    calm, _, _ = generate(reqs)
    squeezed, _, engine = generate(
        reqs, num_kv_blocks=12, block_size=4, max_model_len=48, window_k=4
    )
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats().windows.executed > 0
    assert squeezed == calm


def eos_window_run(window_k: int, min_new_tokens: int = 4):
    """One request on the EOS-biased model: EOS wins the first draw it is allowed in, i.e.
    its (min_new_tokens + 1)-th token. Returns (tokens, the runner's StepResults, engine)."""
    bundle = eos_bundle()
    cfg = SchedulerConfig(max_model_len=256, block_size=4, num_kv_blocks=256)
    runner = ARModelRunner(build_ar_model(bundle), cfg, torch.device("cpu"), torch.float32)
    results: list[StepResult] = []
    execute = runner.execute

    def spy(plan: StepPlan) -> StepResult:
        result = execute(plan)
        results.append(result)
        return result

    runner.execute = spy  # type: ignore[method-assign]
    engine = StageEngine("talker", ARScheduler(cfg, window_k=window_k), runner)
    request = TalkerProcessor(bundle.tokenizer, bundle.vocab, 256).make_request(
        speech("a", max_new_tokens=50)
    )
    request.sampling = dataclasses.replace(request.sampling, min_new_tokens=min_new_tokens)
    engine.add_request(request)
    outputs = engine.run_until_idle()
    assert outputs[-1].finished and outputs[-1].finish_reason == "stop"
    return [t for o in outputs for t in o.tokens], results, engine


def test_eos_inside_a_window_stops_and_frees():
    """min_new_tokens=4: the prefill samples token 1, an 8-step window opens, and EOS is
    token 5, the 4th step of the window. The runner leaves the window at the EOS (nothing
    follows it, in the StepResult or the outputs) and the tokens are the K=0 ones."""
    single, _, _ = eos_window_run(0)
    tokens, results, engine = eos_window_run(8)
    assert single == tokens
    assert len(tokens) == 5 and tokens[-1] == EOS and EOS not in tokens[:-1]
    windows = [r for r in results if r.window_steps > 1]
    assert len(windows) == 1
    window = windows[0].outputs["a"]
    # the window really ran, stopped at the EOS step, and produced nothing after it
    assert windows[0].window_steps == len(window.tokens) == 4
    assert window.tokens[-1] == EOS and EOS not in window.tokens[:-1]
    assert window.frames[-1] is None
    stats = engine.stats().windows
    assert (stats.planned, stats.executed, stats.steps) == (1, 1, 4)
    engine.step()  # delivers the drop to the runner
    assert engine.scheduler.kv.num_used_blocks == 0 and not engine.runner.requests


class AudioCalls:
    """A phase timer that counts the talker's audio (decoder) calls."""

    def __init__(self) -> None:
        self.calls = 0

    @contextlib.contextmanager
    def phase(self, stage: str, name: str):
        self.calls += name == "audio"
        yield


def test_fused_pipeline_audio_is_the_same_with_windows_decoded_once_per_window():
    """A window's frames are decoded in one decoder pass at its end: the same PCM within
    one 16-bit step (a pass over 6 frames rounds differently from six
    passes over one), in 1 (prefill) + 4 windows of 6 decoder calls instead of 25."""
    plain = build("qwen3_tts_fused")
    windowed = build(
        "qwen3_tts_fused",
        "pipeline.stages.talker.window_k=6",
        "pipeline.stages.talker.playback_margin_ms=null",  # fixed windows: not by the clock
    )
    counter = AudioCalls()
    windowed.set_phase_timer(counter)
    try:
        req = speech("w", max_new_tokens=25, ignore_eos=True, seed=8)
        a, b = Collector(), Collector()
        plain.submit(req, a)
        windowed.submit(req, b)
        pa, pb = a.wait().pcm, b.wait().pcm
        assert pa.shape == pb.shape == (25 * 1920,)
        np.testing.assert_allclose(pa, pb, rtol=0, atol=1 / 32768)
        assert stage_stats(windowed, "talker").windows.executed == 4
        assert counter.calls == 5
    finally:
        plain.stop()
        windowed.stop()


def test_stats_mention_windows_only_when_enabled():
    _, _, plain = generate([fixed("a", 4)])
    _, _, win = generate([fixed("a", 4)], window_k=4)
    assert plain.scheduler.gauges().windows is None
    assert win.scheduler.gauges().windows is not None
    # no windows but a playback clock: its arrival steps are counted with the windows'
    plain.scheduler.playback = PlaybackClock(0.08, 0.04)
    assert plain.scheduler.gauges().windows.arrival_steps == 0


# ------------------------------------------------ the runner's run-time gate (_window_refusal)


def decoding_engine():
    """A talker engine whose runner holds r0 and r1 in decode, their next block allocated."""
    engine, proc = talker_engine(block_size=64)
    for i, text in enumerate(["Hello there.", "A longer sentence, to differ."]):
        engine.add_request(proc.make_request(fixed(f"r{i}", 20, seed=i, text=text)))
    for _ in range(3):
        engine.step()
    runner = engine.runner
    assert all(runner.requests[rid].in_decode for rid in ("r0", "r1"))
    return engine, runner


def single_step_tokens(rids) -> dict[str, tuple[int, ...]]:
    """What a plain (no window) single step gives each request on an identical engine."""
    _, runner = decoding_engine()
    result = runner.execute(StepPlan(step_id=99, num_scheduled_tokens={r: 1 for r in rids}))
    assert result.window_steps == 0 and result.window_refusal is None
    return {rid: out.tokens for rid, out in result.outputs.items()}


def assert_refused_as_one_step(result: StepResult, reason: str, rids) -> None:
    assert result.window_refusal == reason
    assert result.window_steps == 1
    assert set(result.outputs) == set(rids)
    assert all(len(result.outputs[rid].tokens) == 1 for rid in rids)


@pytest.mark.parametrize(
    ("reason", "scheduled", "window"),
    [
        ("partial_window", {"r0": 1, "r1": 1}, {"r0": 4}),
        ("plan_mismatch", {"r0": 3, "r1": 3}, {"r0": 3, "r1": 2}),
        ("plan_mismatch", {"r0": 0, "r1": 0}, {"r0": 0, "r1": 0}),
    ],
)
def test_runner_refuses_an_inconsistent_window_and_runs_one_exact_step(reason, scheduled, window):
    _, runner = decoding_engine()
    before = {rid: runner.requests[rid].num_computed for rid in ("r0", "r1")}
    result = runner.execute(StepPlan(step_id=99, num_scheduled_tokens=scheduled, window=window))
    assert_refused_as_one_step(result, reason, ("r0", "r1"))
    assert {rid: runner.requests[rid].num_computed - n for rid, n in before.items()} == {
        "r0": 1,
        "r1": 1,
    }
    tokens = {rid: out.tokens for rid, out in result.outputs.items()}
    assert tokens == single_step_tokens(("r0", "r1"))


def prefilling_runner(left: int):
    """A runner holding 'p' with `left` prompt tokens still to compute (a first chunk ran)."""
    _, proc = talker_engine()
    request = proc.make_request(fixed("p", 20))
    engine, _ = talker_engine(block_size=64, max_num_batched_tokens=request.prompt_len - left)
    engine.add_request(request)
    engine.step()
    held = engine.runner.requests["p"]
    assert held.num_computed == request.prompt_len - left and not held.in_decode
    return engine.runner, held, request.prompt_len


@pytest.mark.parametrize("left", [1, 2])
def test_runner_refuses_a_window_over_a_row_still_in_its_prompt(left):
    """'p' has prompt tokens left: every window row must be decoding, so a window over it
    is refused, and 'p' ends with an error rather than run: the scheduler reconciles a
    window as if every row sampled in its first step, and computing a prompt token without
    a sample would leave the two a token apart. The scheduler never plans one."""
    runner, held, prompt_len = prefilling_runner(left)
    plan = StepPlan(step_id=99, num_scheduled_tokens={"p": 1}, window={"p": 1})
    result = runner.execute(plan)
    assert result.window_refusal == "not_in_decode" and result.window_steps == 1
    assert "in its prompt" in result.outputs["p"].error
    assert held.num_computed == prompt_len - left  # nothing computed


def test_runner_gate_names_a_request_it_does_not_hold():
    _, runner = decoding_engine()
    plan = StepPlan(
        step_id=99, num_scheduled_tokens={"ghost": 2, "r0": 2}, window={"ghost": 2, "r0": 2}
    )
    assert runner._window_refusal(plan) == "unknown_request"


def test_runner_refuses_a_window_naming_an_unknown_request():
    _, runner = decoding_engine()
    plan = StepPlan(
        step_id=99, num_scheduled_tokens={"ghost": 2, "r0": 2}, window={"ghost": 2, "r0": 2}
    )
    result = runner.execute(plan)
    assert result.window_refusal == "unknown_request" and result.window_steps == 1
    assert len(result.outputs["r0"].tokens) == 1
    assert result.outputs["ghost"].error is not None


LENGTHS = (11, 18, 30)


def chunked_run(*overrides: str) -> tuple[list[np.ndarray], int]:
    """Three requests of different lengths on the fused pipeline with 8-step windows: their
    PCM and the number of audio (decoder) phases."""
    pinned = "pipeline.stages.talker.playback_margin_ms=null"  # windows not by the clock
    orch = build("qwen3_tts_fused", "pipeline.stages.talker.window_k=8", pinned, *overrides)
    counter = AudioCalls()
    orch.set_phase_timer(counter)
    try:
        sinks = [Collector() for _ in range(3)]
        for i, (sink, n) in enumerate(zip(sinks, LENGTHS, strict=True)):
            orch.submit(speech(f"c{i}", max_new_tokens=n, ignore_eos=True, seed=i), sink)
        return [s.wait().pcm for s in sinks], counter.calls
    finally:
        orch.stop()


def test_a_window_decoded_in_chunks_gives_the_same_audio_in_order():
    """`audio_chunk_frames=4`: each window's audio is decoded in passes of 4 frames queued
    as their steps are read back. With these lengths rows leave windows mid-chunk (a pass
    holds rows with 4 frames and rows with 1 or 2), and every request's PCM is the one-pass
    PCM within one 16-bit step, in order, with more decoder passes than windows."""
    whole, passes = chunked_run()
    chunked, chunk_passes = chunked_run("pipeline.stages.talker.audio_chunk_frames=4")
    for a, b, n in zip(whole, chunked, LENGTHS, strict=True):
        assert a.shape == b.shape == (n * 1920,)
        np.testing.assert_allclose(b, a, rtol=0, atol=1 / 32768)
    assert chunk_passes > passes


def test_a_chunk_of_the_whole_window_is_one_pass_at_its_end():
    """`audio_chunk_frames` = `window_k`: the one-pass audio and as many decoder passes (on
    CUDA they run on the decoder's own stream, beside the next window's steps)."""
    whole, passes = chunked_run()
    same, same_passes = chunked_run("pipeline.stages.talker.audio_chunk_frames=8")
    for a, b, n in zip(whole, same, LENGTHS, strict=True):
        assert a.shape == b.shape == (n * 1920,)
        np.testing.assert_array_equal(b, a)
    assert same_passes == passes
