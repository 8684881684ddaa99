"""Sweeps: expand Hydra sweep overrides into jobs, run them, summarize into a table and a plot.

    python -m omniflow bench -m pipeline.stages.talker.window_k=0,4,8,12 bench.concurrency=1,4,8
    python -m omniflow sweep summarize DIR

Each job writes DIR/<n>/result.json; the sweep writes DIR/summary.md (a table) and
DIR/rtf.svg (median RTF per job, one line per value of the other swept keys).
"""

from __future__ import annotations

import itertools
import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from omniflow.errors import ConfigError

log = logging.getLogger(__name__)


def expand(overrides: list[str]) -> tuple[list[list[str]], list[str]]:
    """Jobs as override lists (the cartesian product of sweep values) and the swept keys."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise ConfigError("", " ".join(str(exc).split())) from None
    axes: list[list[str]] = []
    swept: list[str] = []
    for o in parsed:
        if o.is_sweep_override():
            key = o.get_key_element()
            axes.append([f"{key}={v}" for v in o.sweep_string_iterator()])
            swept.append(o.key_or_group)
        else:
            axes.append([o.input_line])
    return [list(job) for job in itertools.product(*axes)], swept


def default_sweep_dir() -> Path:
    return Path("multirun") / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def load_results(directory: Path) -> list[dict[str, Any]]:
    results = []
    for path in sorted(directory.glob("*/result.json"), key=lambda p: _job_index(p.parent)):
        results.append(json.loads(path.read_text()))
    if not results:
        raise FileNotFoundError(f"{directory}: no */result.json (is this a sweep directory?)")
    return results


def _job_index(path: Path) -> int:
    return int(path.name) if path.name.isdigit() else 10**9


def _swept(results: list[dict[str, Any]]) -> list[str]:
    """Override keys whose values differ between jobs, in override order."""
    keys: list[str] = []
    values: dict[str, set[str]] = {}
    for r in results:
        for item in r["overrides"]:
            key, _, value = item.partition("=")
            if key not in values:
                keys.append(key)
                values[key] = set()
            values[key].add(value)
    return [k for k in keys if len(values[k]) > 1]


def _value(result: dict[str, Any], key: str) -> str:
    for item in result["overrides"]:
        k, _, v = item.partition("=")
        if k == key:
            return v
    return ""


def summarize(directory: Path) -> str:
    """Write summary.md and rtf.svg into the sweep directory; return the table."""
    results = load_results(directory)
    swept = _swept(results)
    head = [
        *swept,
        "RTF median (min-max)",
        "first audio s",
        "e2e s",
        "audio-s/s",
        "worst underrun s",
        "talker ms/frame",
        "windows (steps)",
    ]
    rows = []
    for r in results:
        s = r["summary"]
        w = r.get("windows") or {}
        rows.append(
            [
                *(_value(r, k) for k in swept),
                f"{s['rtf']['median']:.3f} ({s['rtf']['min']:.3f}-{s['rtf']['max']:.3f})",
                f"{s['ttfp_s']['median']:.3f}",
                f"{s['e2el_s']['median']:.2f}",
                f"{s['audio_throughput']['median']:.2f}",
                f"{s['underrun_s']['max']:.3f}",
                f"{r['talker_ms_per_frame']:.1f}" if r.get("talker_ms_per_frame") else "-",
                f"{w.get('executed_windows', 0)} ({w.get('executed_steps', 0)})" if w else "-",
            ]
        )
    first = results[0]
    table = "\n".join(
        ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        + ["| " + " | ".join(row) + " |" for row in rows]
    )
    cfg = first["config"]
    text = (
        f"# Sweep {directory.name}\n\n{cfg['model']}, {cfg['pipeline']} pipeline, "
        f"{cfg['platform']} ({cfg['dtype']}), {cfg['num_prompts']} prompts per round, "
        f"commit {first.get('commit') or '?'}, {first.get('date', '?')}.\n\n{table}\n"
    )
    (directory / "summary.md").write_text(text)
    (directory / "rtf.svg").write_text(_plot(results, swept))
    return text


def _plot(results: list[dict[str, Any]], swept: list[str]) -> str:
    """A small SVG line chart: x = the last swept key (or job order), y = median RTF."""
    xkey = swept[-1] if swept else None
    series: dict[str, list[tuple[str, float]]] = {}
    for r in results:
        name = ", ".join(f"{k.rsplit('.', 1)[-1]}={_value(r, k)}" for k in swept[:-1]) or "rtf"
        x = _value(r, xkey) if xkey else str(len(series.get(name, [])))
        series.setdefault(name, []).append((x, r["summary"]["rtf"]["median"]))
    xs = sorted({x for pts in series.values() for x, _ in pts}, key=_sort_key)
    ymax = max(y for pts in series.values() for _, y in pts) * 1.1 or 1.0
    w, h, m = 640, 360, 50
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"]

    def px(x: str) -> float:
        i = xs.index(x)
        return m + (w - 2 * m) * (i / max(len(xs) - 1, 1))

    def py(y: float) -> float:
        return h - m - (h - 2 * m) * y / ymax

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'font-family="sans-serif" font-size="12">',
        f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
        f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
        f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">{xkey or "job"}</text>',
        f'<text x="12" y="{m - 10}">median RTF (max {ymax / 1.1:.3f})</text>',
    ]
    for x in xs:
        parts.append(f'<text x="{px(x)}" y="{h - m + 16}" text-anchor="middle">{x}</text>')
    for i, (name, pts) in enumerate(sorted(series.items())):
        pts = sorted(pts, key=lambda p: _sort_key(p[0]))
        c = colors[i % len(colors)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{path}"/>')
        parts.append(f'<text x="{w - m + 4}" y="{m + 16 * i}" fill="{c}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _sort_key(x: str) -> tuple[int, float | str]:
    try:
        return (0, float(x))
    except ValueError:
        return (1, x)
