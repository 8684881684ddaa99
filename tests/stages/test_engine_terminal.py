"""Every request of a chunk-receiving stage ends with exactly one terminal output, in sync
and async scheduling: also those ended while planning (a chunk that can never fit the
budget, a receive deadline), which under async scheduling are produced while another
step is in flight."""

from __future__ import annotations

import pytest

from omniflow.config.schema import StepLimits
from omniflow.engine.connector import ChunkConnector, ChunkIntake
from omniflow.engine.messages import Add, ReceiveFrames
from omniflow.engine.stage_engine import StageEngine
from omniflow.sched.generation import GenerationScheduler, GenRequest
from omniflow.worker.code2wav import Code2WavRunner
from tests.factories import tiny_decoder

FRAME = (1,) * 16


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def engine(async_scheduling: bool, clock: Clock) -> StageEngine:
    # 4 frames x 16 codes fit the budget; a chunk of 5 frames never can.
    sched = GenerationScheduler(
        StepLimits(max_num_seqs=4, max_num_batched_tokens=64),
        tokens_per_frame=16,
        receive_timeout_s=5.0,
        clock=clock,
    )
    intake = ChunkIntake(ChunkConnector(initial_chunk_frames=1, chunk_frames=5), sched)
    return StageEngine(
        "receiver",
        sched,
        Code2WavRunner(tiny_decoder(4)),
        async_scheduling=async_scheduling,
        intake=intake,
    )


def terminals(outputs, rid: str):
    return [o for o in outputs if o.request_id == rid and o.finished]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_chunk_beyond_the_budget_ends_its_request_once(async_scheduling):
    clock = Clock()
    eng = engine(async_scheduling, clock)
    out = eng.apply(Add(GenRequest("big"))) + eng.apply(Add(GenRequest("other")))
    # "big": a 1-frame first chunk, then a 5-frame chunk that can never be scheduled.
    out += eng.apply(ReceiveFrames("big", (FRAME,) * 6, False))
    out += eng.step()  # big's first chunk runs (async: in flight)
    # Another request's chunk is scheduled next, so under async scheduling a step is in
    # flight when big's oversized chunk is refused while planning.
    out += eng.apply(ReceiveFrames("other", (FRAME,) * 2, True))
    out += eng.step()
    out += eng.run_until_idle(max_steps=50)
    (end,) = terminals(out, "big")
    assert end.finish_reason == "error" and "budget" in end.error
    audio = [o for o in out if o.request_id == "big" and o.audio is not None and o.audio.size]
    assert len(audio) == 1  # the first chunk's audio arrived before the error
    (other,) = terminals(out, "other")
    assert other.error is None and other.finish_reason == "stop"


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_receive_deadline_ends_its_request_once(async_scheduling):
    clock = Clock()
    eng = engine(async_scheduling, clock)
    out = eng.apply(Add(GenRequest("stalled"))) + eng.apply(Add(GenRequest("busy")))
    out += eng.apply(ReceiveFrames("stalled", (FRAME,), False))  # arms its deadline
    out += eng.step()  # stalled's first chunk runs
    out += eng.apply(ReceiveFrames("busy", (FRAME,), False))
    out += eng.step()  # busy's chunk runs (async: in flight during the next planning)
    clock.now = 10.0  # past stalled's deadline; busy's last chunk arrives just now
    out += eng.apply(ReceiveFrames("busy", (FRAME,), True))
    out += eng.step()
    out += eng.run_until_idle(max_steps=50)
    (end,) = terminals(out, "stalled")
    assert end.finish_reason == "error" and "no chunk" in end.error
    (busy,) = terminals(out, "busy")
    assert busy.error is None
