"""A step's audio is the runner's second output, waited for by the engine after it applied the
step's tokens (`Runner.take_audio`, `worker/step_audio.py`): under async scheduling the next
step's execute starts before the previous step's audio is waited for; the PCM is the same
either way, and a decode that fails ends the step's requests with one error each."""

from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np
import pytest

from omniflow.core.audio import AudioFailed
from omniflow.worker.step_audio import StepAudio
from tests.factories import intercept_audio, speech, talker_engine

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


class Executes:
    """Counts the runner's execute calls; a decoder call made during call n hands out its PCM
    only once call n + 1 has started (failing after a timeout instead of hanging)."""

    def __init__(self, engine) -> None:
        self.count = 0
        self.cond = threading.Condition()
        runner, model = engine.runner, engine.runner.model
        execute = runner.execute

        def spy(plan):
            with self.cond:
                self.count += 1
                self.cond.notify_all()
            return execute(plan)

        runner.execute = spy  # type: ignore[method-assign]
        intercept_audio(model, lambda rows, call: Gated(call(), self))


class Gated:
    def __init__(self, inner, executes: Executes) -> None:
        self.inner, self.executes, self.made_in = inner, executes, executes.count

    def result(self):
        with self.executes.cond:
            later = self.executes.cond.wait_for(
                lambda: self.executes.count > self.made_in, timeout=30
            )
        assert later, f"the audio of execute {self.made_in} was waited for before the next one"
        return self.inner.result()


@pytest.mark.parametrize("window_k", [0, 4])
def test_async_scheduling_runs_the_next_step_before_waiting_for_the_audio(window_k):
    """Every step's audio, a window's included (whose fence holds the next plan back until
    its tokens are in), is waited for only once the next execute has started; the PCM is
    the sync engine's."""
    engine, proc = talker_engine(async_scheduling=True, stream_decode=True, window_k=window_k)
    executes = Executes(engine)
    pcm = served_pcm(engine, proc, requests(frames=9))
    assert executes.count >= 3
    if window_k:
        assert engine.scheduler.window_stats.executed_windows >= 2
    want_engine, want_proc = talker_engine(stream_decode=True, window_k=window_k)
    want = served_pcm(want_engine, want_proc, requests(frames=9))  # sync, nothing gated
    assert set(pcm) == set(want) == {"r0", "r1"}
    for rid in want:
        assert pcm[rid].shape == (9 * FRAME,)
        np.testing.assert_array_equal(pcm[rid], want[rid])


def test_the_runner_answers_with_tokens_and_hands_the_pending_audio_out_once():
    engine, proc = talker_engine(stream_decode=True, window_k=2)
    for r in requests(1, 3):
        engine.add_request(proc.make_request(r))
    plan = engine.scheduler.schedule()
    result = engine.runner.execute(plan)  # the prefill step: the first frame
    assert result.outputs["r0"].tokens and result.outputs["r0"].audio is None
    audio = engine.runner.take_audio(plan.step_id)
    assert audio is not None and audio.result()["r0"].shape == (FRAME,)
    assert engine.runner.take_audio(plan.step_id) is None


class Failing:
    def result(self):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_decode_failing_names_the_model_when_the_step_audio_is_waited_for():
    with pytest.raises(RuntimeError) as err:
        StepAudio([Failing()], "talker", 7).result()
    assert str(err.value) == (
        "talker step failed: CUDA error: an illegal memory access was encountered"
    )


class Parts:
    def __init__(self, pcm, errors=None):
        self.pcm, self.errors = pcm, errors or {}

    def result(self):
        if self.errors:
            raise AudioFailed(self.errors, self.pcm)
        return self.pcm


def test_a_part_that_fails_some_rows_keeps_the_other_rows_audio_whole():
    """A window decoded in two parts: the second part's row `a` overflowed. `a` has no whole
    audio, so it is named and left out; `b`'s two parts are joined as usual."""
    one = np.ones(4, np.float32)
    first = Parts({"a": one, "b": one})
    second = Parts({"b": 2 * one}, {"a": "not finite"})
    with pytest.raises(AudioFailed) as err:
        StepAudio([first, second], "talker", 7).result()
    assert err.value.errors == {"a": "not finite"}
    assert list(err.value.pcm) == ["b"]
    np.testing.assert_array_equal(err.value.pcm["b"], np.r_[one, 2 * one])


def test_a_silent_rows_samples_and_overflow_are_dropped():
    """A row decoded ahead that drew the stop token made no frame: its samples are not audio,
    and a reduced-precision overflow in them ends nothing."""
    one = np.ones(4, np.float32)
    finite = StepAudio([Parts({"a": one, "s": one})], "talker", 7, frozenset({"s"}))
    assert list(finite.result()) == ["a"]
    overflowed = StepAudio([Parts({"a": one}, {"s": "not finite"})], "talker", 7, frozenset({"s"}))
    assert list(overflowed.result()) == ["a"]
    with pytest.raises(AudioFailed) as err:  # a row that made a frame still fails
        StepAudio([Parts({"s": one}, {"a": "not finite"})], "talker", 7, frozenset({"s"})).result()
    assert err.value.errors == {"a": "not finite"} and list(err.value.pcm) == []


@pytest.mark.parametrize(("async_scheduling", "window_k"), [(False, 0), (True, 0), (True, 4)])
def test_through_the_engine_a_failed_decode_ends_only_its_requests(async_scheduling, window_k):
    """r0's audio fails when settled (its prefill step's, alone): r0 ends with one error and
    its KV and runner state go, while r1, admitted after, streams all its frames."""
    engine, proc = talker_engine(
        stream_decode=True, async_scheduling=async_scheduling, window_k=window_k
    )
    fail = {"r0"}
    intercept_audio(engine.runner.model, lambda rows, call: Failing() if fail & rows else call())
    assert engine.add_request(proc.make_request(requests(1, 6)[0])) == []
    outs = engine.run_until_idle()
    ends = [o for o in outs if o.finished]
    assert [(o.request_id, o.finish_reason) for o in ends] == [("r0", "error")]
    assert "illegal memory access" in ends[0].error
    assert not any(o.audio is not None for o in outs)
    assert engine.runner.requests == {} and engine.scheduler.kv.num_used_blocks == 0
    fail.clear()  # the engine goes on serving
    pcm = served_pcm(engine, proc, [requests(2, 6)[1]])
    assert pcm["r1"].shape == (6 * FRAME,)
    assert engine.scheduler.unfinished_ids() == []


def test_a_talker_without_a_decoder_hands_out_no_audio():
    """The two-stage pipeline's talker makes no audio: nothing to wait for, no audio_wait."""
    engine, proc = talker_engine(stream_decode=False, window_k=2)
    for r in requests(1, 3):
        engine.add_request(proc.make_request(r))
    plan = engine.scheduler.schedule()
    result = engine.runner.execute(plan)
    assert result.outputs["r0"].tokens and engine.runner.take_audio(plan.step_id) is None


def test_audio_failed_pickles_whole():
    """It may cross a process boundary (a Ray stage actor's): both maps survive."""
    import pickle

    sent = AudioFailed({"a": "not finite"}, {"b": np.ones(3, np.float32)})
    got = pickle.loads(pickle.dumps(sent))
    assert isinstance(got, AudioFailed) and got.errors == {"a": "not finite"}
    np.testing.assert_array_equal(got.pcm["b"], np.ones(3, np.float32))
