"""The final audio event of an incremental request says how much speech came after its
text ended (`text_done_frames`, `text_done_at`): the frames up to the step that took the
end of the text, whatever window that step ran in (the WebSocket's
`omniflow_ws_text_tail_*`, docs/websocket.md)."""

from __future__ import annotations

import pytest

from tests.factories import Collector, build, speech, talker_engine

PIECES = ["Hi ", "there, ", "you."]


def taking_step() -> int:
    """The decode step that takes this text's end (the tiny model's tokenizer)."""
    _, proc = talker_engine()
    req = proc.make_request(speech("x", PIECES[0], incremental=True))
    for piece in PIECES[1:]:
        req.live.extend(piece, False)
    req.live.extend("", True)
    return req.live.end_step()


@pytest.mark.parametrize(
    ("pipeline", "window"), [("qwen3_tts_fused", 0), ("qwen3_tts_fused", 4), ("qwen3_tts", 4)]
)
def test_the_final_event_counts_the_frames_up_to_the_step_that_took_the_texts_end(pipeline, window):
    """Decode step s samples frame s + 1 (the prefill samples frame 0), so the step that
    takes the end of the text has made end + 2 frames; a window that runs on past it must
    not count its later frames in."""
    orch = build(pipeline, f"pipeline.stages.talker.window_k={window}")
    try:
        sink = Collector()
        orch.submit(
            speech("a", PIECES[0], max_new_tokens=40, ignore_eos=True, incremental=True), sink
        )
        for piece in PIECES[1:]:
            orch.extend("a", piece, False)
        orch.extend("a", "", True)
        final = sink.wait().terminal
        assert final.error is None and final.frames == 40
        assert final.text_done_at is not None
        assert final.text_done_frames == taking_step() + 2
    finally:
        orch.stop()
