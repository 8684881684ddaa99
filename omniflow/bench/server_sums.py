"""What a job reads from the server's own metrics (`serve/metrics.py`): running totals of
one server (a replica under deploy=ray), snapshotted after the warm-ups and again after the
measured rounds, whose differences are the job's (bench/server_view.py; a reused pipeline's
server is new per job, but its steps are not)."""

from __future__ import annotations

from typing import Any

from omniflow.bench.samples import Samples

FIRST_AUDIO_PARTS = ("intake", "made", "delivery")
MADE_PARTS = ("queued", "steps")
"""`made` in two (waiting for a seat, then the steps), for the requests whose source stage
said when it seated them."""
DELIVERY_PARTS = ("handoff", "response")
"""`delivery` in two (the engine's side to the request's handler on the event loop, then
the response's own work to the first bytes sent)."""


def server_totals(samples: Samples, stage: str) -> dict[str, float]:
    """The server's totals so far: the first-audio histograms' sums (seconds) of the whole
    and of its parts and their request count, the stage's step time (`step_s`) and the audio
    made (`audio_s`)."""

    def value(name: str, labels: dict[str, str] | None = None) -> float:
        return samples.value(name, labels)

    first = {"total": value("omniflow_first_audio_seconds_sum")} | {
        p: value(f"omniflow_first_audio_{p}_seconds_sum")
        for p in (*FIRST_AUDIO_PARTS, *MADE_PARTS, *DELIVERY_PARTS)
    }
    return first | {
        "count": value("omniflow_first_audio_seconds_count"),
        "split_count": value("omniflow_first_audio_queued_seconds_count"),
        "handoff_count": value("omniflow_first_audio_handoff_seconds_count"),
        "step_s": value("omniflow_stage_step_seconds_sum", {"stage": stage}),
        "audio_s": value("omniflow_audio_seconds_total"),
        "tail_count": value("omniflow_ws_text_tail_seconds_count"),
        "tail_s": value("omniflow_ws_text_tail_seconds_sum"),
        "tail_frames": value("omniflow_ws_text_tail_frames_sum"),
    }


def text_tail(accrued: dict[str, float]) -> dict[str, Any] | None:
    """Incremental WebSocket utterances (`bench.transport=websocket`): the mean time from the
    step that took the end of the text to the last audio sent, and the mean frames made after
    it (the speech still to come once the text had ended); None when none was observed."""
    n = accrued.get("tail_count", 0)
    if n <= 0:
        return None
    return {
        "utterances": int(n),
        "mean_ms": 1e3 * accrued["tail_s"] / n,
        "mean_frames": accrued["tail_frames"] / n,
    }


def first_audio_parts(accrued: dict[str, float]) -> dict[str, Any] | None:
    """Mean first audio of the requests in `accrued` (the measured rounds: the warm-ups ran
    before), measured by the server and split where it went (intake, the pipeline making it,
    delivery); the load generator's ttfp adds the network and its own side. None when no
    request got audio. `made` is split (`queued_ms`, `steps_ms`, over `split_requests`) where
    the source stage said when it seated the requests, delivery (`handoff_ms`, `response_ms`)
    where the server could split it; otherwise those are None. A server older than a split
    reports none of it (its metric absent: 0)."""
    n, split = accrued["count"], accrued["split_count"]
    if n <= 0:
        return None
    means = {f"{k}_ms": 1e3 * accrued[k] / n for k in ("total", *FIRST_AUDIO_PARTS)}
    made = {f"{k}_ms": 1e3 * accrued[k] / split if split > 0 else None for k in MADE_PARTS}
    handed = accrued.get("handoff_count", 0)
    delivery = {
        f"{k}_ms": 1e3 * accrued[k] / handed if handed > 0 else None for k in DELIVERY_PARTS
    }
    return {"requests": int(n)} | means | {"split_requests": int(split)} | made | delivery
