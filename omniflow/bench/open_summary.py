"""The open-loop part of a sweep's summary: one row per job (a rate, or another swept value),
and the plot of p95 first audio and the stalled fraction against req/s (open_loop.png).

    omniflow bench -m bench.rps=1,10,20 bench.duration_s=60

summary.md (bench/sweep.py) carries this section for a sweep's open-loop jobs (those whose
result.json has an `open_loop` object); a closed-loop table comes first when the sweep has
both. `-` stands for a number no request gave. Jobs over WebSocket
(`bench.transport=websocket`) add the last audio after input.done (p50 / p95 / p99).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omniflow.bench.plot import OpenLoopPoint, plot_open_loop
from omniflow.bench.sweep import override_value, precision, swept_keys


def open_loop_section(results: list[dict[str, Any]], directory: Path, heading: str) -> str:
    """The section's markdown (under `heading`), with the plot written beside summary.md."""
    swept = [k for k in swept_keys(results) if k != "bench.rps"]  # the rate has its own column
    sockets = any("last_audio_after_done_ms" in r["open_loop"] for r in results)
    head = [
        *swept,
        "req/s",
        "requests",
        "succeeded",
        "rejected",
        "failed",
        "first audio ms p50 / p95 / p99",
        "stalled (fraction)",
        "stall ms total / largest",
        "peak in flight",
        "audio-s/s",
        *(["last audio after input.done ms p50 / p95 / p99"] if sockets else []),
    ]
    rows = []
    for r in results:
        o = r["open_loop"]
        first = o["first_audio_ms"]
        fraction = o["underrun_fraction"]
        rows.append(
            [
                *(override_value(r, k) for k in swept),
                f"{o['rps']:g}",
                str(o["requests"]),
                str(o["succeeded"]),
                rejected_text(o),
                str(o["failed"]),
                " / ".join(_ms(first[p]) for p in ("p50", "p95", "p99")),
                "-" if fraction is None else f"{o['underrun_requests']} ({fraction:.3f})",
                f"{o['stall_ms']['total']:.0f} / {o['stall_ms']['largest']:.0f}",
                str(o["peak_in_flight"]),
                f"{o['delivered_audio_s_per_s']:.2f}",
            ]
        )
        if sockets:
            after = o.get("last_audio_after_done_ms") or {}  # an HTTP job of the sweep: -
            rows[-1].append(" / ".join(_ms(after.get(p)) for p in ("p50", "p95", "p99")))
    table = "\n".join(
        ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        + ["| " + " | ".join(row) + " |" for row in rows]
    )
    points = [
        OpenLoopPoint(
            series=", ".join(f"{k.rsplit('.', 1)[-1]}={override_value(r, k)}" for k in swept),
            rps=r["open_loop"]["rps"],
            p95_ms=r["open_loop"]["first_audio_ms"]["p95"],
            stalled_fraction=r["open_loop"]["underrun_fraction"],
        )
        for r in results
        if r["open_loop"]["succeeded"]  # no request succeeded: nothing to plot
    ]
    plot = plot_open_loop(points, directory / "open_loop.png") if points else None
    first = results[0]
    cfg, o = first["config"], first["open_loop"]
    return (
        f"{heading}\n\n{cfg['model']}, {cfg['pipeline']} pipeline, {cfg['platform']} "
        f"({precision(results)}), open loop{_over(o)}: {o['arrivals']} arrivals "
        f"(seed {o['seed']}), {o['duration_s']:g} s measured after {o['warmup_s']:g} s of "
        "warm-up, prompts at their natural length; "
        f"commit {first.get('commit') or '?'}, {first.get('date', '?')}.\n\n"
        f"{table}\n"
        + (
            f"\n![p95 first audio and stalled fraction against req/s]({plot.name})\n"
            if plot
            else ""
        )
    )


def _over(o: dict[str, Any]) -> str:
    """How the first job's arrivals spoke (nothing for HTTP, the default)."""
    if o.get("transport") != "websocket":  # results written before the key existed: HTTP
        return ""
    return f" over WebSocket (incremental, a word every {o['word_interval_ms']:g} ms)"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def rejected_text(o: dict[str, Any]) -> str:
    """The refusals, and how fast the p95 one came (over WebSocket, or a result from before
    it: the count); summary.md's and `benchmarks.open_loop_table`'s column."""
    p95 = (o.get("rejected_ms") or {}).get("p95")
    return str(o["rejected"]) if p95 is None else f"{o['rejected']} (p95 {p95:.0f} ms)"
