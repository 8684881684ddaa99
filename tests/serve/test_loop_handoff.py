"""`event_queue.LoopHandoff`: engine threads hand events to the serving loop with one wake-up
per burst (each `call_soon_threadsafe` is a system call on the engine thread), every event
delivered once, in order per request."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from omniflow.core.events import AudioEvent
from omniflow.serve.event_queue import LoopHandoff, event_channel


class RecordingLoop:
    """Stands in for the event loop: records the wake-ups instead of running them."""

    def __init__(self) -> None:
        self.scheduled: list = []

    def call_soon_threadsafe(self, fn, *args) -> None:
        self.scheduled.append((fn, args))

    def run_scheduled(self) -> None:
        pending, self.scheduled = self.scheduled, []
        for fn, args in pending:
            fn(*args)


def ev(rid: str, i: int) -> AudioEvent:
    return AudioEvent(rid, pcm=np.full(2, i, dtype=np.float32), frames=i)


def test_a_burst_of_events_wakes_the_loop_once_and_keeps_each_requests_order():
    loop = RecordingLoop()
    handoff = LoopHandoff(loop)  # type: ignore[arg-type]
    qa: asyncio.Queue[AudioEvent] = asyncio.Queue()
    qb: asyncio.Queue[AudioEvent] = asyncio.Queue()
    for i in range(5):  # one step's events of two requests, then more
        handoff.put(qa, ev("a", i))
        handoff.put(qb, ev("b", i))
    assert len(loop.scheduled) == 1
    loop.run_scheduled()
    assert [qa.get_nowait().frames for _ in range(5)] == [0, 1, 2, 3, 4]
    assert [qb.get_nowait().frames for _ in range(5)] == [0, 1, 2, 3, 4]
    assert qa.empty() and qb.empty()
    handoff.put(qa, ev("a", 5))  # after a drain, the next event wakes the loop again
    assert len(loop.scheduled) == 1
    loop.run_scheduled()
    assert qa.get_nowait().frames == 5


def test_a_requests_first_event_goes_ahead_of_the_bursts_others():
    """One step's events of running streams, then a new stream's first audio: the new one is
    drained first, so its handler wakes first on the loop; each request keeps its order.
    Every stream is fed through its own sink, which marks only its first event."""

    async def main() -> list[str]:
        handoff = LoopHandoff(asyncio.get_running_loop())
        channels = {rid: event_channel(handoff) for rid in ("a", "b", "new")}
        gets = {"a": 2, "b": 2, "new": 2}
        # parked[rid][i]: the handler waits for its i-th event (nothing awaited in between)
        parked = {rid: [asyncio.Event() for _ in range(n)] for rid, n in gets.items()}
        woke: list[str] = []

        async def handler(rid: str) -> None:
            for i in range(gets[rid]):
                parked[rid][i].set()
                got = await channels[rid][0].get()
                woke.append(f"{rid}{got.frames}")

        tasks = [asyncio.create_task(handler(rid)) for rid in gets]
        for rid in ("a", "b"):  # the running streams' first events, taken before the burst
            await parked[rid][0].wait()
            channels[rid][1](ev(rid, 0))
        for rid in ("a", "b"):
            await parked[rid][1].wait()  # its first event taken, waiting for the next
        await parked["new"][0].wait()
        woke.clear()
        # one burst: the running streams' next frames, then the new stream's first and second
        channels["a"][1](ev("a", 1))
        channels["b"][1](ev("b", 1))
        channels["new"][1](ev("new", 0))
        channels["new"][1](ev("new", 1))
        await asyncio.gather(*tasks)
        return woke

    woke = asyncio.run(main())
    assert woke[0] == "new0"  # ahead of a1 and b1, fed before it
    assert woke.index("new0") < woke.index("new1")  # its own order kept
    assert sorted(woke) == ["a1", "b1", "new0", "new1"]


def test_events_from_several_threads_all_arrive_on_a_real_loop():
    async def main() -> list[int]:
        handoff = LoopHandoff(asyncio.get_running_loop())
        queue, sink = event_channel(handoff)

        def produce(base: int) -> None:
            for i in range(200):
                sink(ev("r", base + i))

        threads = [threading.Thread(target=produce, args=(k * 1000,)) for k in range(4)]
        for t in threads:
            t.start()
        got = [(await queue.get()).frames for _ in range(800)]
        for t in threads:
            t.join()
        return got

    got = asyncio.run(main())
    assert sorted(got) == sorted(k * 1000 + i for k in range(4) for i in range(200))
    for k in range(4):  # each producer's events in its own order
        mine = [f for f in got if f // 1000 == k]
        assert mine == sorted(mine)


def test_a_closed_loop_is_reported_on_every_event_not_swallowed():
    """Nothing can drain into a closed loop: each put says so (before, the first failure left
    an event pending and every later put returned silently, its event lost)."""
    loop = asyncio.new_event_loop()
    loop.close()
    handoff = LoopHandoff(loop)
    q: asyncio.Queue[AudioEvent] = asyncio.Queue()
    for i in range(3):
        with pytest.raises(RuntimeError, match="closed"):
            handoff.put(q, ev("r", i))


def test_a_service_served_from_another_loop_gets_a_handoff_for_that_loop():
    """The test client without `with` runs each request on a fresh event loop; every request
    must still get its audio (a handoff bound to the first loop would feed a dead one)."""
    from starlette.testclient import TestClient

    from omniflow.config.compose import compose
    from omniflow.serve.routes import build_app
    from tests.serve.fake_pipeline import FakePipeline

    pipe = FakePipeline()
    pipe.start()
    client = TestClient(build_app(pipe, compose(["platform=cpu"]).server))
    body = {
        "model": "qwen3-tts-tiny",
        "voice": "vivian",
        "input": "hi",
        "response_format": "pcm",
        "max_new_tokens": 2,
    }
    answers: list[tuple[int, int]] = []

    def two_requests() -> None:
        for _ in range(2):
            r = client.post("/v1/audio/speech", json=body)
            answers.append((r.status_code, len(r.content)))

    # A daemon thread: were the audio fed to a dead loop, the request would wait forever.
    worker = threading.Thread(target=two_requests, daemon=True)
    worker.start()
    worker.join(timeout=30)
    pipe.stop()
    assert answers == [(200, 2 * 1920 * 2)] * 2
