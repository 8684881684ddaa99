"""The bench's server-side text tail (`bench/server_sums.py`): the WebSocket endpoint's
`omniflow_ws_text_tail_*` sums, read from a server's samples and averaged over the
utterances a job's rounds added."""

from __future__ import annotations

import pytest

from omniflow.bench.samples import Samples
from omniflow.bench.server_sums import server_totals, text_tail


def samples(count: float, seconds: float, frames: float) -> Samples:
    return Samples(
        (
            ("omniflow_ws_text_tail_seconds_count", (), count),
            ("omniflow_ws_text_tail_seconds_sum", (), seconds),
            ("omniflow_ws_text_tail_frames_sum", (), frames),
        )
    )


def test_the_tail_is_the_mean_over_the_utterances_a_job_added():
    before = server_totals(samples(2, 0.5, 40), "talker")
    after = server_totals(samples(6, 1.7, 120), "talker")
    accrued = {k: after[k] - before[k] for k in after}
    tail = text_tail(accrued)
    assert tail == {"utterances": 4, "mean_ms": pytest.approx(300.0), "mean_frames": 20.0}


def test_no_incremental_utterance_gives_no_tail():
    assert text_tail(server_totals(Samples(()), "talker")) is None
