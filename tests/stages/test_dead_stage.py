"""A stage whose loop dies is visible: its requests end with one error each, requests queued
for it are refused, and the pipeline refuses new work (the server answers 503)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from omniflow.core.pipeline import PipelineUnavailable
from omniflow.engine.messages import Add, Wake
from tests.factories import Collector, build, intercept_audio, speech


@dataclass(frozen=True)
class Late:
    request_id: str


class Boom(Exception):
    """Not a RuntimeError/ValueError: the runner does not turn it into a request error, so
    it escapes into the engine loop, as a bug would."""


def kill_on_next_step(engine) -> threading.Event:
    """Make the engine's next execute raise (fault injection at the runner boundary)."""
    hit = threading.Event()

    def execute(plan):
        hit.set()
        raise Boom("injected fault")

    engine.runner.execute = execute
    return hit


@pytest.mark.parametrize("victim", [0, 1])
def test_a_dead_stage_ends_its_requests_and_refuses_new_ones(victim):
    orch = build("qwen3_tts")
    try:
        engine = orch.engines[victim]
        hit = kill_on_next_step(engine)
        c = Collector()
        orch.submit(speech("doomed", max_new_tokens=20, ignore_eos=True), c)
        assert hit.wait(30)
        c.wait()
        term = c.terminal
        assert term.finish_reason == "error" and "injected fault" in term.error
        stats = orch.stats()
        assert not stats.healthy
        assert [s.alive for s in stats.stages] == [i != victim for i in range(2)]
        assert stats.in_flight == 0
        dead = stats.stages[victim]  # the dying loop released what its scheduler held
        assert dead.running == dead.waiting == 0 and not dead.kv_blocks_used
        with pytest.raises(PipelineUnavailable, match=engine.name):
            orch.submit(speech("after"), Collector())
        # A request that reaches the dead engine anyway (sent before the check) ends at once
        # with one error rather than waiting in an inbox nobody reads.
        late = []
        engine.on_output = late.append
        engine.send(Add(Late("late")))
        engine.send(Wake())
        assert [(o.request_id, o.finish_reason) for o in late] == [("late", "error")]
    finally:
        orch.stop()


class BoomAudio:
    def result(self):
        raise Boom("injected fault in the audio")


@pytest.mark.parametrize(
    "overrides",
    [
        ("pipeline.stages.talker.scheduler.async_scheduling=false",),
        ("pipeline.stages.talker.scheduler.async_scheduling=true",),
    ],
    ids=["sync", "async"],
)
def test_a_stage_dying_while_waiting_for_a_steps_audio_still_ends_that_steps_requests(overrides):
    """The update has already ended the one-frame request when its audio is waited for; the
    loop dies there, and the request still gets its one error (not silence)."""
    orch = build("qwen3_tts_fused", *overrides)
    try:
        engine = orch.engines[0]
        intercept_audio(engine.runner.model, lambda rows, call: BoomAudio())
        c = Collector()
        orch.submit(speech("one", max_new_tokens=1, ignore_eos=True), c)
        term = c.wait(timeout=20).terminal
        assert term.finish_reason == "error" and "injected fault in the audio" in term.error
        assert not orch.stats().healthy and orch.stats().in_flight == 0
    finally:
        orch.stop()
