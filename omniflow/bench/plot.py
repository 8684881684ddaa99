"""The sweep plot: median RTF and worst player underrun per job, side by side (PNG).

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
