"""Held frames (`audio_pass_steps`: `sched/audio_cycle.py`, `worker/held_audio.py`): single
steps' frames decoded several steps at a time give every request the codes and the PCM of
decoding each step's frames at once, whole and in order, in fewer decoder passes."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omniflow.core.output import StageOutput
from omniflow.core.step import StepPlan
from omniflow.models.interface import FrameSample, SampledStep
from omniflow.sched.audio_cycle import AudioCycle
from omniflow.sched.playback import PlaybackClock
from omniflow.sched.window import Candidate
from omniflow.worker.held_audio import HeldFrames
from tests.factories import eos_bundle, speech, talker_engine
from tests.stages.test_talker_engine import collect, fixed, preemptible


def pcm_of(outputs: list[StageOutput]) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    for o in outputs:
        if o.audio is not None:
            parts[o.request_id].append(o.audio)
    return {rid: np.concatenate(p) for rid, p in parts.items()}


def run(requests, min_new_tokens: dict[str, int] | None = None, **kw):
    """The engine's outputs for `requests`, the steps of each decoder call that had frames to
    decode, and the engine. `min_new_tokens`: per request (a stop frame comes after them on
    `eos_bundle`)."""
    engine, proc = talker_engine(stream_decode=True, **kw)
    slots = engine.runner.model.slots
    queue = slots.queue
    calls = []

    def counted(steps):
        if any(f is not None for s in steps for f in s.sample.outputs):
            calls.append(len(steps))
        return queue(steps)

    ahead = slots.queue_ahead

    def counted_ahead(request_ids, frames, made):
        calls.append(1)  # one step's frames, queued before they were read back
        return ahead(request_ids, frames, made)

    slots.queue = counted
    slots.queue_ahead = counted_ahead
    for r in requests:
        made = proc.make_request(r)
        if r.request_id in (min_new_tokens or {}):
            least = (min_new_tokens or {})[r.request_id]
            made.sampling = dataclasses.replace(made.sampling, min_new_tokens=least)
        assert engine.add_request(made) == []
    return engine.run_until_idle(), calls, engine


def assert_same_audio(plain: list[StageOutput], held: list[StageOutput]) -> None:
    assert collect(held) == collect(plain)  # the codes: when audio is decoded changes nothing
    a, b = pcm_of(plain), pcm_of(held)
    assert a.keys() == b.keys()
    for rid in a:
        frames = sum(f is not None for o in plain if o.request_id == rid for f in o.frames)
        assert a[rid].shape == b[rid].shape == (frames * 1920,), rid
        # a pass over several frames rounds differently from one pass a frame
        np.testing.assert_allclose(b[rid], a[rid], rtol=0, atol=1 / 32768)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_held_frames_give_each_steps_pcm_in_fewer_passes(async_scheduling):
    # lengths that end inside a cycle of 4, at its last step, and one cycle in
    reqs = [fixed(f"r{n}", n, seed=n) for n in (9, 13, 14, 20)]
    plain, plain_calls, _ = run(reqs, async_scheduling=async_scheduling)
    held, held_calls, engine = run(reqs, async_scheduling=async_scheduling, audio_pass_steps=4)
    assert_same_audio(plain, held)
    assert engine.scheduler.gauges().windows.audio_cycles >= 4
    assert max(held_calls) > 1  # passes over several steps' frames
    assert len(held_calls) < 0.6 * len(plain_calls)


@pytest.mark.parametrize("least", [10, 11])
def test_a_stop_frame_inside_a_cycle_lets_its_held_frames_go(least):
    """The stop comes at token least + 1: the 2nd or 3rd step of the third cycle (the first
    token is the prefill's), with one or two frames held."""
    bundle = eos_bundle()
    reqs = [speech("s", max_new_tokens=50, seed=2), fixed("f", 16, seed=3)]
    plain, _, _ = run(reqs, {"s": least}, bundle=bundle)
    held, _, _ = run(reqs, {"s": least}, bundle=bundle, audio_pass_steps=4)
    end = next(o for o in held if o.request_id == "s" and o.finished)
    assert end.finish_reason == "stop"
    assert_same_audio(plain, held)


def test_a_preempted_row_decodes_what_it_held_before_its_state_is_parked():
    reqs = [preemptible(f"r{i}", seed=i) for i in range(3)]
    calm, _, _ = run(reqs)
    squeezed = dict(num_kv_blocks=12, block_size=4, max_model_len=48, audio_pass_steps=4)
    held, _, engine = run(reqs, **squeezed)
    assert engine.scheduler.num_preemptions > 0
    assert_same_audio(calm, held)


# ---------------------------------------------------------------- the runner's held frames


def step(rows: str, start: int, stop: str = "") -> SampledStep:
    """Rows named by letters; row r's frame in this step is (start + its index,) * 16, or a
    stop (None) for the letters in `stop`."""
    outputs = tuple(None if r in stop else (start + i,) * 16 for i, r in enumerate(rows))
    codes = torch.tensor([[start + i] * 16 for i in range(len(rows))])
    sample = FrameSample(tuple(range(len(rows))), outputs, codes[:, 0], codes)
    return SampledStep(tuple(rows), sample)


class Decoder:
    """Records each call: {row: its frames' first codes}, checked against the device codes."""

    def __init__(self) -> None:
        self.calls: list[dict[str, list[int]]] = []

    def __call__(self, steps):
        call: dict[str, list[int]] = defaultdict(list)
        for s in steps:
            for i, (r, f) in enumerate(zip(s.request_ids, s.sample.outputs, strict=True)):
                if f is not None:
                    assert int(s.sample.next_frames[i, 0]) == f[0]  # rows kept in step
                    call[r].append(f[0])
        self.calls.append(dict(call))
        return SimpleNamespace(rows=dict(call))


def test_held_rows_let_go_when_not_named_when_absent_and_when_they_end():
    decoder, ending = Decoder(), set()
    held = HeldFrames(decoder, lambda rid: rid in ending)
    # c is new this cycle: it decodes at once; a and b hold
    assert len(held.step(step("abc", 10), later={"a", "b"})) == 1
    assert decoder.calls[-1] == {"c": [12]}
    # b sits this step out: its frame goes now (audio-only output); a holds on
    held.step(step("ac", 20), later={"a", "b", "c"})
    assert decoder.calls[-2:] == [{"b": [11]}, {"c": [21]}]  # c joined mid-cycle: at once
    # a reaches its length cap: its three frames in one pass
    ending.add("a")
    held.step(step("a", 30), later={"a"})
    assert decoder.calls[-1] == {"a": [10, 20, 30]}
    assert held.rows == () and held.steps == []


def test_a_stop_frame_and_a_preemption_release_and_a_finish_drops():
    decoder = Decoder()
    held = HeldFrames(decoder, lambda rid: False)
    held.step(step("abc", 10), later={"a", "b", "c"})
    assert decoder.calls == []
    held.step(step("abc", 20, stop="b"), later={"a", "b", "c"})  # b stops: what it held goes
    assert decoder.calls == [{"b": [11]}]
    held.release({"a"})  # preempted: decoded now, sent with the next step's audio
    assert decoder.calls[-1] == {"a": [10, 20]} and len(held.released) == 1
    held.drop({"c"})  # finished (aborted): its frames are dropped, not decoded
    assert held.rows == ()
    parts = held.release_all()
    assert len(parts) == 1 and decoder.calls[-1] == {"a": [10, 20]}


def test_the_cycles_last_step_lets_every_held_row_go_together():
    decoder = Decoder()
    held = HeldFrames(decoder, lambda rid: False)
    held.step(step("ab", 10), later={"a", "b"})
    held.step(step("ab", 20), later={"a", "b"})
    held.step(step("ab", 30), later=set())
    assert decoder.calls == [{"a": [10, 20, 30], "b": [11, 21, 31]}]


# ---------------------------------------------------------------- the scheduler's cycles


def candidate(rid: str, *, new=False, prompt=False, live=False, frames=5) -> Candidate:
    request = SimpleNamespace(
        request_id=rid,
        prompt_len=10,
        num_tokens=10 + frames,
        output_tokens=[0] * frames,
        live=object() if live else None,
    )
    before = 4 if prompt else 10 + frames - 1
    return Candidate(request, 1, before, new)  # type: ignore[arg-type]


def test_a_cycle_holds_decoding_rows_for_its_steps_but_its_last():
    cycle = AudioCycle(4, None)
    rows = [candidate("a"), candidate("b"), candidate("n", new=True), candidate("p", prompt=True)]
    rows.append(candidate("l", live=True))
    assert [cycle.plan(rows, windowed=False) for _ in range(4)] == [{"a", "b"}] * 3 + [set()]
    assert cycle.cycles == 1 and not cycle.running


def test_a_row_that_leaves_a_cycle_does_not_come_back_and_an_empty_cycle_ends():
    cycle = AudioCycle(4, None)
    assert cycle.plan([candidate("a"), candidate("b")], windowed=False) == {"a", "b"}
    assert cycle.plan([candidate("a")], windowed=False) == {"a"}
    assert cycle.plan([candidate("a"), candidate("b")], windowed=False) == {"a"}
    cycle = AudioCycle(4, None)
    cycle.plan([candidate("a")], windowed=False)
    assert cycle.plan([candidate("z", new=True)], windowed=False) == set()
    assert not cycle.running  # windows may open again


def test_no_cycle_in_a_window_and_its_length_is_what_slack_covers():
    assert AudioCycle(4, None).plan([candidate("a")], windowed=True) == set()
    assert AudioCycle(0, None).plan([candidate("a")], windowed=False) == set()
    now = [100.0]
    clock = PlaybackClock(frame_s=0.08, margin_s=0.0, now=lambda: now[0])
    clock.observe_step(0.05, 1, rows=1)
    clock.frames_made("a", 0, at=100.0 - 0.2)  # 5 frames made: 0.4 s of audio, 0.2 s played
    cycle = AudioCycle(8, clock)
    held = [cycle.plan([candidate("a")], windowed=False) for _ in range(4)]
    assert held == [{"a"}, {"a"}, {"a"}, set()]  # 0.2 s of slack covers 4 steps of 0.05 s
    clock.frames_made("b", 0, at=100.0 - 0.37)  # 0.03 s of slack: not one step
    cycle = AudioCycle(8, clock)  # b decodes at once; its slack does not shorten a's cycle
    held = [cycle.plan([candidate("a"), candidate("b")], windowed=False) for _ in range(4)]
    assert held == [{"a"}, {"a"}, {"a"}, set()]
    clock.frames_made("c", 0, at=100.0)  # 0.4 s of slack: 8 steps, the cap
    cycle = AudioCycle(8, clock)  # both for 4 steps save more than c alone for 8
    assert cycle.plan([candidate("a"), candidate("c")], windowed=False) == {"a", "c"}
    assert cycle.left == 3
    cycle = AudioCycle(8, clock)  # c alone, for as long as its slack covers; b never
    assert cycle.plan([candidate("b"), candidate("c")], windowed=False) == {"c"}
    assert cycle.left == 7


def test_a_cycle_is_as_long_as_slack_covers_though_window_chunks_would_leave_early():
    """A window whose audio leaves in chunks may run past its slack (each chunk comes in
    time); held frames leave only at the cycle's end."""
    clock = PlaybackClock(frame_s=0.08, margin_s=0.0, chunk_steps=2, now=lambda: 100.0)
    clock.observe_step(0.03, 1, rows=1)
    clock.frames_made("a", 0, at=100.0 - 0.3)  # 5 frames made, 0.3 s played: 0.1 s of slack
    assert clock.window_steps(8, [("a", 5)], 100.0) == 8  # a chunked window: the whole cap
    cycle = AudioCycle(8, clock)
    held = [cycle.plan([candidate("a")], windowed=False) for _ in range(3)]
    assert held == [{"a"}, {"a"}, set()]  # 0.1 s covers 3 steps of 0.03 s


def test_a_plan_of_another_cycle_releases_what_the_runner_holds():
    """No hold outlasts the cycle that sized it, also when the step that ended the cycle never
    reached the decoder (a prefill alone, an empty plan)."""
    engine, proc = talker_engine(stream_decode=True, audio_pass_steps=4)
    for r in (fixed("a", 12, seed=1), fixed("b", 12, seed=2)):
        assert engine.add_request(proc.make_request(r)) == []
    engine.step()  # the prefill: first frames at once
    engine.step()
    engine.step()  # two steps of a cycle of 4
    held = engine.runner.ops.held
    assert set(held.rows) == {"a", "b"} and len(held.steps) == 2
    plan = engine.scheduler.schedule()  # the cycle's third step, as a new cycle's first
    assert plan.audio_later == {"a", "b"} and plan.audio_cycle == 1
    engine.runner.execute(dataclasses.replace(plan, audio_cycle=2))
    assert len(held.steps) == 1  # the old hold went first; the new cycle holds its own step
    engine.runner.execute(StepPlan(step_id=10_000, num_scheduled_tokens={}))
    assert held.rows == () and len(held.released) == 1


def test_a_decoder_failure_while_letting_go_drops_the_held_frames_not_the_stage():
    engine, proc = talker_engine(stream_decode=True, audio_pass_steps=4)
    for r in (fixed("a", 12, seed=1), fixed("b", 12, seed=2)):
        assert engine.add_request(proc.make_request(r)) == []
    for _ in range(3):
        engine.step()  # the prefill, then two steps of a cycle
    held = engine.runner.ops.held
    assert held.rows

    def broken(steps):
        raise RuntimeError("decoder down")

    engine.runner.model.slots.queue = broken
    result = engine.runner.execute(StepPlan(step_id=10_000, num_scheduled_tokens={}))
    assert result.outputs == {} and held.rows == () and held.steps == []


def test_a_cycle_ends_early_when_its_steps_grow_past_the_slack_it_was_sized_with():
    now = [100.0]
    clock = PlaybackClock(frame_s=0.08, margin_s=0.0, now=lambda: now[0])
    clock.observe_step(0.05, 1, rows=1)
    clock.frames_made("a", 0, at=100.0 - 0.2)  # 0.2 s of slack: 4 steps of 0.05 s
    cycle = AudioCycle(8, clock)
    assert cycle.plan([candidate("a")], windowed=False) == {"a"} and cycle.left == 3
    now[0] += 0.05
    assert cycle.plan([candidate("a", frames=6)], windowed=False) == {"a"}  # 0.15 s for 2 left
    for _ in range(6):
        clock.observe_step(0.2, 1, rows=1)  # the steps grow to ~0.2 s
    now[0] += 0.05
    assert cycle.plan([candidate("a", frames=7)], windowed=False) == set()  # let go now
    assert not cycle.running
