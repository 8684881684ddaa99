"""An audio event says when the source stage first seated its request (`seated_at`), so the
server can split the pipeline's part of first audio into waiting for a seat and the steps
after it (`omniflow_first_audio_{queued,steps}_seconds`)."""

from __future__ import annotations

import pytest

from tests.factories import Collector, build, speech


@pytest.mark.parametrize("pipeline", ["qwen3_tts_fused", "qwen3_tts"])
def test_a_request_behind_the_only_seat_is_seated_when_the_first_leaves(pipeline):
    """One seat, two requests submitted together: the second is seated only after the
    first; every audio event of a request carries its one seat time, which lies before its
    first audio. Fused, the talker makes the audio on the thread that seats: the second is
    seated after the first's first audio (it ends frames later). Two-stage, code2wav may
    still be decoding the first's audio when its talker seat frees: no such order."""
    orch = build(pipeline, "pipeline.stages.talker.scheduler.max_num_seqs=1", start=False)
    try:
        sinks = {rid: Collector() for rid in ("a", "b")}
        for rid, sink in sinks.items():
            orch.submit(speech(rid, max_new_tokens=4, ignore_eos=True), sink)
        orch.start()
        for sink in sinks.values():
            assert sink.wait().terminal.error is None
        audio = {rid: [e for e in s.events if e.pcm is not None] for rid, s in sinks.items()}
        seated = {}
        for rid, events in audio.items():
            assert events, rid
            assert {e.seated_at for e in events} == {events[0].seated_at}  # one seat time
            seated[rid] = events[0].seated_at
            assert seated[rid] is not None and seated[rid] < events[0].made_at
        assert seated["b"] > seated["a"]
        if pipeline == "qwen3_tts_fused":
            assert seated["b"] > audio["a"][0].made_at  # it waited for a's seat
    finally:
        orch.stop()
