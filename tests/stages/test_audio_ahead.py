"""A single step's audio is queued before its frames are read back (`StepOps.audio_ahead`,
`StreamSlots.queue_ahead`): every row's frame decoded from the device codes, the rows that drew
the stop token dropped once the read shows them (`StepAudio.silent`). Held frames
(`audio_pass_steps`) and a window's later steps keep the audio after the read. The PCM is the
same either way: tests/stages/test_audio_passes.py compares it with held frames' (decoded
from the host's codes), stop frames included."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import pytest

from tests.factories import eos_bundle, speech, talker_engine


class Phases:
    """Each phase's name as it is entered, in order."""

    def __init__(self) -> None:
        self.entered: list[str] = []

    @contextmanager
    def phase(self, stage: str, name: str):
        self.entered.append(name)
        yield

    def add(self, stage: str, name: str, seconds: float) -> None:
        return None


def phases_of(stop_token_ids: tuple[int, ...] | None = None, **kw) -> list[str]:
    engine, proc = talker_engine(stream_decode=True, **kw)
    timer = Phases()
    engine.runner.set_timer(timer, "talker")
    for i in range(2):
        made = proc.make_request(speech(f"r{i}", seed=i, max_new_tokens=5 + i, ignore_eos=True))
        if stop_token_ids is not None and i == 0:  # r0, the shorter
            made.sampling = dataclasses.replace(made.sampling, stop_token_ids=stop_token_ids)
        assert engine.add_request(made) == []
    outs = engine.run_until_idle()
    assert all(o.error is None for o in outs)
    assert sum(o.audio.size for o in outs if o.audio is not None) == (5 + 6) * 1920
    return timer.entered


def before_each_read(entered: list[str]) -> list[str]:
    return [entered[i - 1] for i, name in enumerate(entered) if name == "readback"]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_single_steps_queue_their_audio_before_the_read_back(async_scheduling):
    """Mixed steps (a prefill's first frame) and decode steps alike."""
    entered = phases_of(async_scheduling=async_scheduling)
    assert "prefill" in entered and "decode_step" in entered
    assert before_each_read(entered) == ["audio"] * entered.count("readback")
    assert entered.count("audio") == entered.count("readback")


def test_held_frames_wait_for_the_read_back():
    """Which rows hold their frame is decided on the read codes."""
    entered = phases_of(audio_pass_steps=4)
    assert "audio" not in before_each_read(entered)


def test_a_request_that_may_draw_the_stop_token_and_go_on_waits_for_the_read_back():
    """Its row would make no frame, yet its slot would be decoded again after the frame
    decoded ahead, which is not audio: every step with it in keeps the audio after the
    read; once it has ended, the other request's steps go ahead again."""
    entered = phases_of(stop_token_ids=(), window_k=0)
    before = before_each_read(entered)
    assert "audio" not in before[:5] and before[5] == "audio"  # r0 ran 5 steps, r1 6


def test_a_windows_later_steps_decode_after_their_read():
    """A window of 4 queues its next step before reading this one; only a step that is the
    whole call (a request's last, or a window of one) goes ahead."""
    before = before_each_read(phases_of(window_k=4))
    assert len(before) == 6  # the prefill's frame, a window of 4, r1's last step alone
    assert before[0] == before[5] == "audio" and "audio" not in before[1:5]


def test_a_requests_last_step_hands_out_no_audio_to_wait_for():
    """Its only row drew the stop token: the pass decoded ahead is not audio, so the step's
    ending output does not wait for it (`StepOps.settle` gives None); the request's audio is
    its frames', whole."""
    engine, proc = talker_engine(stream_decode=True, bundle=eos_bundle())
    settled = []
    settle = engine.runner.ops.settle

    def spy(ahead, step, step_id):
        settled.append(settle(ahead, step, step_id))
        return settled[-1]

    engine.runner.ops.settle = spy
    made = proc.make_request(speech("s", seed=2, max_new_tokens=50))
    made.sampling = dataclasses.replace(made.sampling, min_new_tokens=4)
    assert engine.add_request(made) == []
    outs = engine.run_until_idle()
    end = next(o for o in outs if o.finished)
    assert end.finish_reason == "stop"
    frames = sum(f is not None for o in outs for f in o.frames)
    assert frames == 4 and sum(o.audio.size for o in outs if o.audio is not None) == 4 * 1920
    assert len(settled) == 5 and settled[-1] is None  # 4 frames, then the stop token's step
    assert all(s is not None for s in settled[:-1])
