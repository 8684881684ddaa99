"""A job's server-side figures from two readings of the server's metrics (after the
warm-ups, and after the measured load): each server's counts (a Ray deployment's replicas
one by one), their differences, and those summed over the servers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omniflow.bench.samples import Reading, finished
from omniflow.bench.server_sums import first_audio_parts, server_totals, text_tail
from omniflow.bench.stage_counts import prefills_of, prefills_since, windows_of, windows_since
from omniflow.core.pipeline import PrefillCounters


@dataclass(frozen=True)
class Counts:
    """One server's running totals at one reading."""

    finished: int
    totals: dict[str, float]
    windows: dict[str, int] | None
    prefills: PrefillCounters | None


Snapshot = dict[str, Counts]
"""Each server's counts, by its name (`samples.LOCAL` in-process, else the replica's id)."""


def snapshot_of(reading: Reading, stage: str) -> Snapshot:
    """The counts of every server in `reading`; `stage` is the AR stage."""
    return {
        name: Counts(
            finished(s), server_totals(s, stage), windows_of(s, stage), prefills_of(s, stage)
        )
        for name, s in reading.items()
    }


@dataclass(frozen=True)
class Accrued:
    """What the servers did between two snapshots: the server totals, windows and prefills
    summed over the servers, and per server its finished requests, audio and first audios."""

    totals: dict[str, float]
    windows: dict[str, int] | None
    prefills: dict[str, int] | None
    per_server: dict[str, dict[str, Any]]


def accrued(before: Snapshot, after: Snapshot) -> Accrued | str:
    """The differences, or why there are none: a server in one snapshot and not the other
    (a replica replaced mid-job starts its counters at zero: a difference would be wrong)."""
    if before.keys() != after.keys():
        gone, new = sorted(before.keys() - after.keys()), sorted(after.keys() - before.keys())
        return f"the replicas changed during the job (gone: {gone}, new: {new})"
    totals: dict[str, float] = {}
    windows: dict[str, int] | None = None
    prefills: dict[str, int] | None = None
    per_server = {}
    for name, now in sorted(after.items()):
        was = before[name]
        own = {k: now.totals[k] - was.totals[k] for k in now.totals}
        totals = {k: totals.get(k, 0.0) + v for k, v in own.items()}
        w = windows_since(was.windows, now.windows)
        if w is not None:
            windows = _add(windows, w)
        p = prefills_since(was.prefills, now.prefills)
        if p is not None:
            prefills = _add(prefills, p)
        per_server[name] = {
            "requests": now.finished - was.finished,
            "first_audio_requests": int(own["count"]),
            "audio_s": own["audio_s"],
        }
    return Accrued(totals, windows, prefills, per_server)


def _add(into: dict[str, int] | None, more: dict[str, int]) -> dict[str, int]:
    """`into` plus `more`, key by key (a key in one only counts as 0 in the other)."""
    out = dict(into or {})
    for key, value in more.items():
        out[key] = out.get(key, 0) + value
    return out


SERVER_FIELDS = ("first_audio_parts", "talker_ms_per_frame", "served_frames", "windows")
SERVER_FIELDS += ("prefills", "text_tail")


def server_fields(
    got: Accrued | str, sample_rate: int, per_replica: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """The result's server-side fields from what accrued (`per_replica`: also `replicas`,
    each replica's own requests, first audios and audio), and the fields left null with why
    (`got` is then the reason)."""
    if isinstance(got, str):
        nulls = dict.fromkeys((*SERVER_FIELDS, *(("replicas",) if per_replica else ())), got)
        return dict.fromkeys(nulls), nulls
    t = got.totals
    frames = t["audio_s"] * sample_rate / 1920
    fields = {
        "first_audio_parts": first_audio_parts(t),
        "talker_ms_per_frame": (1e3 * t["step_s"] / frames) if frames and t["step_s"] else None,
        "served_frames": round(frames),
        "windows": got.windows,
        "prefills": got.prefills,
        "text_tail": text_tail(t),
    }
    if per_replica:
        fields["replicas"] = got.per_server
    return fields, {}
