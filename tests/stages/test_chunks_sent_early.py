"""Under async scheduling a window's audio chunks leave while the window runs
(`engine/chunk_inbox.py`): the same PCM as when they are joined at the window's end, a chunk
at a time; a chunk that fails ends its requests once, the others keep their audio."""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from omniflow.core.audio import AudioFailed
from omniflow.engine.chunk_inbox import ChunkInbox
from omniflow.engine.step_loop import StepLoop
from tests.factories import Collector, build, speech, talker_engine

FRAME = 1920  # samples of one frame at 24 kHz
K, C = 8, 2


def requests():
    return [
        speech(
            f"r{i}", text="Hello there." * (i + 1), seed=3 + i, max_new_tokens=21, ignore_eos=True
        )
        for i in range(2)
    ]


def audio_parts(loop, proc) -> tuple[dict[str, list[np.ndarray]], list]:
    for r in requests():
        assert loop.add_request(proc.make_request(r)) == []
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    outputs = loop.run_until_idle()
    for out in outputs:
        if out.audio is not None:
            parts[out.request_id].append(out.audio)
    return parts, outputs


def engine(async_scheduling: bool):
    return talker_engine(
        async_scheduling=async_scheduling, stream_decode=True, window_k=K, audio_chunk_frames=C
    )


def test_async_chunks_leave_one_by_one_with_the_pcm_of_the_joined_window():
    joined, _ = audio_parts(*engine(async_scheduling=False))
    early, _ = audio_parts(*engine(async_scheduling=True))
    assert joined.keys() == early.keys() == {"r0", "r1"}
    for rid in joined:
        # sync: a window's chunks leave together at its end; async: each on its own
        assert max(len(p) for p in joined[rid]) > C * FRAME
        assert max(len(p) for p in early[rid]) <= C * FRAME
        assert np.array_equal(np.concatenate(joined[rid]), np.concatenate(early[rid]))


class Broken:
    """A chunk whose decoding fails: for `rows` only (AudioFailed), or as a whole."""

    def __init__(self, inner, rows: set[str] | None) -> None:
        self.inner, self.rows = inner, rows

    def result(self):
        pcm = self.inner.result()
        if self.rows is None:
            raise RuntimeError("decoder exploded")
        errors = {rid: "overflow in this row" for rid in self.rows if rid in pcm}
        raise AudioFailed(errors, {r: a for r, a in pcm.items() if r not in errors})


class BreaksSecondChunk:
    """The runner with its second window chunk broken on its way to the engine."""

    def __init__(self, runner, rows: set[str] | None) -> None:
        self.runner, self.rows, self.seen = runner, rows, 0

    def send_chunks(self, sink) -> None:
        def broken(audio) -> None:
            self.seen += 1
            sink(Broken(audio, self.rows) if self.seen == 2 else audio)

        self.runner.send_chunks(broken)

    def execute(self, plan):
        return self.runner.execute(plan)

    def take_audio(self, step_id):
        return self.runner.take_audio(step_id)

    def watch_arrivals(self, arrivals) -> None:
        self.runner.watch_arrivals(arrivals)

    def decoder_slots(self):
        return self.runner.decoder_slots()

    def prefills(self):
        return self.runner.prefills()

    def set_timer(self, timer, stage) -> None:
        self.runner.set_timer(timer, stage)


def run_broken(rows: set[str] | None):
    inner, proc = engine(async_scheduling=True)
    loop = StepLoop(
        "talker", inner.scheduler, BreaksSecondChunk(inner.runner, rows), async_scheduling=True
    )
    return loop, audio_parts(loop, proc)[1]


def test_a_chunk_failing_for_one_row_ends_that_request_once_and_the_other_plays_on():
    loop, outputs = run_broken({"r0"})
    ends = {o.request_id: o for o in outputs if o.finished}
    assert ends["r0"].finish_reason == "error" and "overflow" in ends["r0"].error
    assert ends["r1"].finish_reason == "length"
    assert sum(1 for o in outputs if o.finished and o.request_id == "r0") == 1
    r1 = sum(len(o.audio) for o in outputs if o.request_id == "r1" and o.audio is not None)
    assert r1 == 21 * FRAME  # every frame of the other request, nothing lost
    assert loop.scheduler.kv.num_used_blocks == 0


def after_the_end(outputs) -> list[str]:
    """Requests with an output after their terminal one."""
    ended: set[str] = set()
    late = []
    for o in outputs:
        if o.request_id in ended:
            late.append(o.request_id)
        if o.finished:
            ended.add(o.request_id)
    return late


def test_nothing_of_a_request_follows_its_end():
    _, outputs = run_broken({"r0"})  # r0 ends at its failed chunk; its window ran on
    assert after_the_end(outputs) == []
    loop, proc = engine(async_scheduling=True)
    for r in requests():
        assert loop.add_request(proc.make_request(r)) == []
    outputs = loop.step() + loop.step() + loop.step()  # a window of r0 in flight
    outputs += loop.abort_request("r0")
    outputs += loop.run_until_idle()
    assert [o.finish_reason for o in outputs if o.finished and o.request_id == "r0"] == ["abort"]
    assert after_the_end(outputs) == []


def test_a_chunk_failing_as_a_whole_ends_each_of_its_requests_once():
    loop, outputs = run_broken(None)
    ends = [o for o in outputs if o.finished]
    assert sorted(o.request_id for o in ends) == ["r0", "r1"]
    assert all(o.finish_reason == "error" and "exploded" in o.error for o in ends)
    assert loop.scheduler.kv.num_used_blocks == 0


def test_the_inbox_gives_each_step_its_own_chunks_in_order():
    inbox = ChunkInbox()
    with ThreadPoolExecutor(1) as pool:  # steps run one at a time, in order, as the runner's

        def step(names: list[str]) -> None:
            for n in names:
                inbox.chunk(n)

        first = pool.submit(step, ["a1", "a2"])
        inbox.watch(first)
        second = pool.submit(step, ["b1"])
        inbox.watch(second)
        assert list(inbox.drain()) == ["a1", "a2"]
        assert list(inbox.drain()) == ["b1"]


def test_a_served_window_reaches_the_listener_a_chunk_at_a_time():
    orch = build(
        "qwen3_tts_fused",
        f"pipeline.stages.talker.window_k={K}",
        f"pipeline.stages.talker.audio_chunk_frames={C}",
        "pipeline.stages.talker.playback_margin_ms=null",  # windows of K whenever allowed
    )
    try:
        sink = Collector()
        orch.submit(speech("a", max_new_tokens=26, ignore_eos=True), sink)
        sink.wait()
    finally:
        orch.stop()
    frames = [len(e.pcm) // FRAME for e in sink.events if e.pcm is not None]
    assert sum(frames) == 26 and max(frames) == C  # 8-step windows, each in 4 chunks
