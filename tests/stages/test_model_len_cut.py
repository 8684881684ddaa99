"""A request cut short at max_model_len ends as "length" like one at its max_new_tokens (a
200 stream cannot tell them apart), so the server's log names the cut and the key that
raises the limit, as `omniflow config` prints it (`sched/ar_tokens.py`)."""

from __future__ import annotations

import logging

from tests.factories import Collector, build, speech

KEY = "pipeline.stages.talker.scheduler.max_model_len"


def test_a_request_cut_at_max_model_len_names_the_key_that_raises_it(caplog):
    orch = build("qwen3_tts_fused", f"{KEY}=64")
    try:
        cut, asked = Collector(), Collector()
        with caplog.at_level(logging.WARNING, logger="omniflow.sched.ar_tokens"):
            orch.submit(speech("cut", max_new_tokens=200, ignore_eos=True), cut)
            orch.submit(speech("asked", max_new_tokens=3, ignore_eos=True), asked)
            ends = [c.wait().events[-1].finish_reason for c in (cut, asked)]
    finally:
        orch.stop()
    assert ends == ["length", "length"]
    [record] = [r for r in caplog.records if "max_model_len" in r.getMessage()]
    message = record.getMessage()
    assert message.startswith("request cut reached max_model_len 64") and f"raise {KEY} " in message
