"""A step's audio is waited for when the scheduler takes the step's result, not inside the
runner (`stages/step_audio.py`): under async scheduling the next step's execute starts before
the previous step's audio is waited for; the PCM is the same either way, and a decode that
fails at that point ends the step's requests with one error each, nothing else."""

from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np
import pytest

from omniflow.core.step import RequestStepOutput
from omniflow.stages.step_audio import StepAudio
from tests.factories import speech, talker_engine

FRAME = 1920


def requests(n: int = 2, frames: int = 5):
    return [
        speech(
            f"r{i}",
            text="Hello there." * (i + 1),
            seed=3 + i,
            max_new_tokens=frames,
            ignore_eos=True,
        )
        for i in range(n)
    ]


def served_pcm(engine, proc, reqs) -> dict[str, np.ndarray]:
    for r in reqs:
        assert engine.add_request(proc.make_request(r)) == []
    pcm: dict[str, list[np.ndarray]] = defaultdict(list)
    for out in engine.run_until_idle():
        assert out.error is None, out.error
        if out.audio is not None:
            pcm[out.request_id].append(out.audio)
    return {rid: np.concatenate(parts) for rid, parts in pcm.items()}


class Gated:
    """A decoder call whose result waits for `gate` (failing after a timeout instead of
    hanging the suite), then gives the real PCM."""

    def __init__(self, inner, gate: threading.Event) -> None:
        self.inner, self.gate = inner, gate

    def result(self):
        assert self.gate.wait(timeout=30), "the audio was waited for before the next step ran"
        return self.inner.result()


def gate_after_first_execute(engine) -> threading.Event:
    """The gate opens when the runner's second execute starts; every decoder call waits for
    it. Only if the engine submits step n+1 before waiting for step n's audio can the first
    step's audio ever be returned."""
    gate = threading.Event()
    runner, model = engine.runner, engine.runner.model
    execute, queue_audio = runner.execute, model.queue_audio
    calls = []

    def spy(plan):
        calls.append(plan.step_id)
        if len(calls) >= 2:
            gate.set()
        return execute(plan)

    runner.execute = spy  # type: ignore[method-assign]
    model.queue_audio = lambda steps: Gated(queue_audio(steps), gate)  # type: ignore[method-assign]
    return gate


@pytest.mark.parametrize("window_k", [0, 2])
def test_async_scheduling_runs_the_next_step_before_waiting_for_the_audio(window_k):
    engine, proc = talker_engine(async_scheduling=True, stream_decode=True, window_k=window_k)
    gate = gate_after_first_execute(engine)
    pcm = served_pcm(engine, proc, requests())
    assert gate.is_set()
    want_engine, want_proc = talker_engine(stream_decode=True, window_k=window_k)
    want = served_pcm(want_engine, want_proc, requests())  # sync, nothing gated
    assert set(pcm) == set(want) == {"r0", "r1"}
    for rid in want:
        assert pcm[rid].shape == (5 * FRAME,)
        np.testing.assert_array_equal(pcm[rid], want[rid])


def test_the_runner_answers_with_the_audio_still_pending_and_settling_adds_it():
    engine, proc = talker_engine(stream_decode=True, window_k=2)
    for r in requests(1, 3):
        engine.add_request(proc.make_request(r))
    plan = engine.scheduler.schedule()
    result = engine.runner.execute(plan)  # the prefill step: the first frame
    assert result.late_audio is not None and result.outputs["r0"].audio is None
    settled = result.settled()
    assert settled.late_audio is None and settled.outputs["r0"].audio.shape == (FRAME,)
    assert settled.outputs["r0"].tokens == result.outputs["r0"].tokens
    assert settled.settled() is settled


class Failing:
    def result(self):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_decode_failing_when_settled_ends_each_request_of_the_step_once():
    outputs = {"a": RequestStepOutput(tokens=(1,)), "b": RequestStepOutput(tokens=(2,))}
    settled = StepAudio([Failing()], "talker", 7).attach(outputs)
    assert set(settled) == {"a", "b"}
    for out in settled.values():
        assert (
            out.error == "talker step failed: CUDA error: an illegal memory access was encountered"
        )


def test_through_the_engine_a_failed_decode_ends_only_that_steps_requests():
    engine, proc = talker_engine(stream_decode=True)
    model = engine.runner.model
    queue_audio = model.queue_audio
    fail = {"r0"}

    def queue(steps):
        if any(fail & set(s.request_ids) for s in steps):
            return Failing()
        return queue_audio(steps)

    model.queue_audio = queue  # type: ignore[method-assign]
    assert engine.add_request(proc.make_request(requests(1, 4)[0])) == []
    outs = engine.run_until_idle()
    ends = [o for o in outs if o.finished]
    assert [(o.request_id, o.finish_reason) for o in ends] == [("r0", "error")]
    assert "illegal memory access" in ends[0].error
    fail.clear()  # the engine goes on serving
    pcm = served_pcm(engine, proc, [requests(2, 3)[1]])
    assert pcm["r1"].shape == (3 * FRAME,)
    assert engine.scheduler.unfinished_ids() == []
