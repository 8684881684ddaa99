"""While the server runs, a full garbage collection does not walk the startup heap.

Everything alive when the pipeline has started (modules, weights, the app: ~200,000 objects
in this test process) is frozen (`serve.run.freeze_heap`). Without it a full collection,
which a burst's allocations trigger, walked all of them with the event loop stopped
(150-220 ms on this project's 2-core machine), and the /health probe that arrived then
waited for it (docs/reliability.md). What a full collection walks is exactly what
`gc.get_objects()` lists, so the test counts that rather than timing a collection.
"""

from __future__ import annotations

import gc

import httpx

from tests.serve.conftest import LiveServer


def test_a_full_collection_while_serving_skips_the_startup_heap():
    server = LiveServer()  # built (weights and all) before it starts
    gc.collect()
    before = len(gc.get_objects())
    with server:
        body = {"model": "qwen3-tts-tiny", "voice": "vivian", "input": "Hi.", "max_new_tokens": 2}
        answer = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=60)
        assert answer.status_code == 200
        walked = len(gc.get_objects())
        server.wait_idle()
    assert before > 50_000  # the startup heap is large enough for this to say something
    assert walked < before / 10, (walked, before)
    # Shutdown gives it back to the collector.
    assert gc.get_freeze_count() == 0
    assert len(gc.get_objects()) > before / 2
