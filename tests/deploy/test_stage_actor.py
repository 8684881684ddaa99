"""A stage actor's own logic without a cluster (`deploy/stage_actor.py`): batches applied in
the order they were numbered, a message the stage cannot apply ending its request with one
error while the batches after it go on, batches meant for an earlier actor (sent as it
died, delivered to the one Ray restarted) dropped, and an actor that did not die but is
started under a new generation (the driver took a lost call for a death) starting clean."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ray")  # stage_actor.py defines a Ray actor class (no cluster started)

from omniflow.config.compose import compose  # noqa: E402
from omniflow.config.resolve import build_graph  # noqa: E402
from omniflow.deploy.stage_actor import Sequencer, StageActor  # noqa: E402
from omniflow.deploy.stage_wire import NotStarted, Prepared  # noqa: E402
from omniflow.engine.messages import Abort, Add, Hold, Wake  # noqa: E402
from tests.factories import speech  # noqa: E402


def test_batches_are_applied_in_the_order_they_were_numbered():
    """A threaded actor runs its calls in no promised order: a batch that overtakes an
    earlier one waits for it."""
    applied = []
    sequencer = Sequencer()
    sequencer.apply(2, (Hold("c"),), applied.append)
    sequencer.apply(1, (Hold("b"), Wake()), applied.append)
    assert applied == []
    sequencer.apply(0, (Hold("a"),), applied.append)
    assert applied == [Hold("a"), Hold("b"), Wake(), Hold("c")]


def test_a_batch_that_raises_does_not_hold_back_the_next():
    applied = []

    def apply(message):
        if message == Hold("bad"):
            raise KeyError("bad")
        applied.append(message)

    sequencer = Sequencer()
    with pytest.raises(KeyError):
        sequencer.apply(0, (Hold("bad"),), apply)
    sequencer.apply(1, (Hold("next"),), apply)
    assert applied == [Hold("next")]


def test_a_request_the_stage_cannot_make_ends_with_one_error_and_the_rest_go_on():
    graph = build_graph(compose(["pipeline=qwen3_tts", "platform=cpu"]))
    actor = StageActor(graph, "talker", "warning")
    actor.generation = 0  # as start(0) leaves it, without the engine's thread
    try:
        actor.send(0, 0, (Add(Prepared("ghost"), None),))  # never prepared: nothing to add
        actor.prepare(speech("real", max_new_tokens=2, ignore_eos=True, seed=1))
        actor.send(0, 1, (Add(Prepared("real"), None), Abort("real")))
        (out,) = actor.outbox.take(0)[0]
        assert out.request_id == "ghost" and out.finish_reason == "error"
        assert "could not take request ghost" in out.error
        assert actor.sequencer.next == 2 and "real" not in actor.prepared
    finally:
        actor.stop()


def test_batches_of_another_generation_are_dropped():
    """Until started, and then for any generation but the one `start` gave."""
    graph = build_graph(compose(["pipeline=qwen3_tts", "platform=cpu"]))
    actor = StageActor(graph, "talker", "warning")
    try:
        actor.send(0, 0, (Add(Prepared("early"), None),))  # before start: no generation yet
        actor.generation = 1  # as start(1) leaves it, without the engine's thread
        actor.send(0, 0, (Add(Prepared("stale"), None),))  # meant for the actor that died
        assert actor.outbox.take(0)[0] == [] and actor.sequencer.next == 0
        actor.send(1, 0, (Add(Prepared("ghost"), None),))
        (out,) = actor.outbox.take(0)[0]
        assert out.request_id == "ghost" and actor.sequencer.next == 1
    finally:
        actor.stop()


def outputs_until(actor: StageActor, done, timeout_s: float = 60.0) -> list:
    """The actor's outputs, taken until `done(outputs so far)` holds."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while not done(got):
        assert time.monotonic() < deadline, got
        got += actor.outbox.take(0.1)[0]
    return got


def test_a_new_generation_on_a_running_actor_aborts_what_it_held_and_starts_clean():
    graph = build_graph(compose(["pipeline=qwen3_tts_fused", "platform=cpu"]))
    actor = StageActor(graph, "talker", "warning")
    try:
        with pytest.raises(NotStarted):  # restarted by Ray, not yet started by the driver
            actor.prepare(speech("early"))
        actor.start(0)
        actor.prepare(speech("held", max_new_tokens=400, ignore_eos=True, seed=1))
        actor.send(0, 0, (Add(Prepared("held"), None),))
        outputs_until(actor, lambda got: any(o.request_id == "held" for o in got))
        actor.start(0)  # sent again (a call that may not have arrived): nothing changes
        assert actor.outbox.open == {"held"}
        actor.start(1)  # the driver has ended "held" with an error
        assert actor.outbox.open == set() and actor.sequencer.next == 0
        actor.prepare(speech("next", max_new_tokens=3, ignore_eos=True, seed=2))
        actor.send(0, 1, (Add(Prepared("ghost"), None),))  # stale: dropped
        actor.send(1, 0, (Add(Prepared("next"), None),))  # numbered from 0 again
        got = outputs_until(actor, lambda got: any(o.finished for o in got))
        assert {o.request_id for o in got} == {"next"}  # nothing more of "held" or "ghost"
        assert got[-1].finish_reason == "length"
        assert actor.engine.stats().running == 0  # "held" was aborted, not left running
    finally:
        actor.stop()
