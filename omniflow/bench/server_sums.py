"""What a job reads from the server's own metrics (`serve/metrics.py`): running totals,
snapshotted after the warm-ups and again after the measured rounds, whose differences are
the job's (a reused pipeline's server is new per job, but its steps are not)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

FIRST_AUDIO_PARTS = ("intake", "made", "delivery")


def first_audio_sums(registry: CollectorRegistry) -> dict[str, float]:
    """The server's first-audio histograms so far: the sums (seconds) of the whole and of
    its parts (`serve/metrics.py`), and the count of requests."""

    def total(name: str) -> float:
        return registry.get_sample_value(f"omniflow_first_audio{name}_seconds_sum") or 0.0

    sums = {"total": total("")} | {p: total(f"_{p}") for p in FIRST_AUDIO_PARTS}
    count = registry.get_sample_value("omniflow_first_audio_seconds_count") or 0.0
    return sums | {"count": count}


def first_audio_parts(since: dict[str, float], now: dict[str, float]) -> dict[str, Any] | None:
    """Mean first audio of the requests between two `first_audio_sums` (the measured rounds:
    the warm-ups ran before), measured by the server and split where it went (intake, the
    pipeline making it, delivery); the load generator's ttfp adds the network and its own
    side. None when no request got audio."""
    n = now["count"] - since["count"]
    if n <= 0:
        return None
    means = {f"{k}_ms": 1e3 * (now[k] - since[k]) / n for k in ("total", *FIRST_AUDIO_PARTS)}
    return {"requests": int(n)} | means


def served_sums(registry: CollectorRegistry, stage: str) -> dict[str, float]:
    """The server's totals so far of the stage's step time and of the audio made (seconds):
    a job reports the difference over its measured rounds."""
    step = registry.get_sample_value("omniflow_stage_step_seconds_sum", {"stage": stage})
    audio = registry.get_sample_value("omniflow_audio_seconds_total")
    return {"step_s": step or 0.0, "audio_s": audio or 0.0}
