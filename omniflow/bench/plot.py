"""The sweep plots: median RTF and worst player underrun per closed-loop job, side by side
(rtf.png); p95 first audio and the stalled fraction against req/s for open-loop jobs
(open_loop.png).

matplotlib is the `[bench]` extra: without it the table is still written and the plot is
skipped with a log line saying how to get it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Point:
    """One job: its series (the other swept keys), x value, median RTF and worst underrun."""

    series: str
    x: str
    rtf: float
    underrun_s: float


def sort_key(x: str) -> tuple[int, float | str]:
    """Numbers in numeric order, then names."""
    try:
        return (0, float(x))
    except ValueError:
        return (1, x)


def plot_sweep(points: list[Point], xlabel: str, path: Path) -> Path | None:
    """Write the two panels to `path`; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("no plot: matplotlib is not installed (pip install 'omniflow[bench]')")
        return None
    xs = sorted({p.x for p in points}, key=sort_key)
    series = sorted({p.series for p in points})
    fig, (ax_rtf, ax_under) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for name in series:
        pts = sorted((p for p in points if p.series == name), key=lambda p: sort_key(p.x))
        pos = [xs.index(p.x) for p in pts]
        ax_rtf.plot(pos, [p.rtf for p in pts], marker="o", label=name)
        ax_under.plot(pos, [p.underrun_s for p in pts], marker="o", label=name)
    ax_rtf.axhline(1.0, color="black", linestyle="--", linewidth=1, label="RTF = 1 (real time)")
    ax_rtf.set_ylim(bottom=0, top=max(1.1, 1.1 * max(p.rtf for p in points)))
    ax_rtf.set_ylabel("median RTF (lower is faster)")
    ax_rtf.set_title("Real-time factor")
    ax_under.set_ylim(bottom=0, top=max(0.1, 1.1 * max(p.underrun_s for p in points)))
    ax_under.set_ylabel("worst player underrun (s)")
    ax_under.set_title("Player underrun (0 = never starved)")
    for ax in (ax_rtf, ax_under):
        ax.set_xticks(range(len(xs)), xs)
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class OpenLoopPoint:
    """One open-loop job: its series (the other swept keys), its rate, its p95 first audio
    and the fraction of its succeeded requests that stalled."""

    series: str
    rps: float
    p95_ms: float
    stalled_fraction: float


def plot_open_loop(points: list[OpenLoopPoint], path: Path) -> Path | None:
    """p95 first audio and the stalled fraction against req/s, side by side (PNG); None
    when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("no plot: matplotlib is not installed (pip install 'omniflow[bench]')")
        return None
    fig, (ax_first, ax_stall) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for name in sorted({p.series for p in points}):
        pts = sorted((p for p in points if p.series == name), key=lambda p: p.rps)
        label = name or "open loop"
        ax_first.plot([p.rps for p in pts], [p.p95_ms for p in pts], marker="o", label=label)
        ax_stall.plot(
            [p.rps for p in pts], [p.stalled_fraction for p in pts], marker="o", label=label
        )
    ax_first.set_ylim(bottom=0, top=1.1 * max(p.p95_ms for p in points))
    ax_first.set_ylabel("p95 first audio (ms)")
    ax_first.set_title("Time to first audio")
    ax_stall.set_ylim(
        bottom=0, top=min(1.05, max(0.1, 1.1 * max(p.stalled_fraction for p in points)))
    )
    ax_stall.set_ylabel("requests that stalled (fraction)")
    ax_stall.set_title("Playback stalls (zero-buffer player; 0 = none)")
    for ax in (ax_first, ax_stall):
        ax.set_xlim(left=0)
        ax.set_xlabel("arrival rate (req/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
