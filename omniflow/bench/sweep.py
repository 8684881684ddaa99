"""Sweeps: the jobs of a Hydra sweep, and the summary of a sweep directory.

    omniflow bench -m pipeline.stages.talker.window_k=0,4,8,12 bench.concurrency=1,4,8
    omniflow sweep summarize DIR

Hydra runs the jobs (bench/app.py); each writes DIR/<n>/result.json. When the sweep ends,
`SweepSummary` (a Hydra callback) writes DIR/summary.md (a table) and DIR/rtf.png (median
RTF and worst player underrun per job, bench/plot.py; needs the `[bench]` extra). The table's
`failed` column counts the job's failed requests over all rounds (its numbers cover the
completed ones; result.json has the error texts); `-` stands for a number no request gave.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

# Hydra's basic sweeper (the one `-m` runs) is reached through its plugin module: its
# split_arguments is the expansion itself, so validation sees exactly the jobs Hydra runs.
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from tqdm import tqdm

from omniflow.bench.plot import Point, plot_sweep
from omniflow.errors import ConfigError
from omniflow.logs import BAR_DISABLE

log = logging.getLogger(__name__)


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs Hydra's basic sweeper makes of `overrides` (the cartesian product of the
    sweeps), each as its list of overrides."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise ConfigError("", " ".join(str(exc).split())) from None
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


class SweepSummary(Callback):
    """A progress bar over the sweep's jobs, and the summary when the sweep ends."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None
        self.done = 0

    def __getstate__(self) -> dict[str, Any]:
        """A process launcher (joblib) pickles the callbacks into its workers: the bar stays
        in the parent, where the sweep's jobs are counted."""
        return {"bar": None, "done": 0}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        total = len(sweep_jobs(list(config.hydra.overrides.task)))
        # on a terminal only (in a file its frames would run into the log lines); the job's
        # log lines print above it (logs.py), and without it a line says each job's end
        self.bar = tqdm(
            total=total, desc="sweep", unit=" jobs", file=sys.stderr, disable=BAR_DISABLE
        )

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if self.bar is not None:  # None in a launcher's worker process
            self.bar.update(1)
            self.done += 1
            if self.bar.disable:
                log.info("sweep: job %d of %d done", self.done, self.bar.total)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.close()
        root = Path(config.hydra.sweep.dir)
        print(summarize(root))
        print(f"results: {root}")


def load_results(directory: Path) -> list[dict[str, Any]]:
    results = []
    for path in sorted(directory.glob("*/result.json"), key=lambda p: _job_index(p.parent)):
        results.append(json.loads(path.read_text()))
    if not results:
        raise FileNotFoundError(f"{directory}: no */result.json (is this a sweep directory?)")
    return results


def _job_index(path: Path) -> int:
    return int(path.name) if path.name.isdigit() else 10**9


def swept_keys(results: list[dict[str, Any]]) -> list[str]:
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


def override_value(result: dict[str, Any], key: str) -> str:
    for item in result["overrides"]:
        k, _, v = item.partition("=")
        if k == key:
            return v
    return ""


def precision(results: list[dict[str, Any]]) -> str:
    """The jobs' dtypes for a summary's first line: the talker's, then the codec decoder's
    (one for all jobs, or "per job" where they differ; results from before the decoder's
    was recorded name none)."""
    talker = results[0]["config"]["dtype"]
    codec = {r["config"].get("codec_dtype") for r in results} - {None}
    if not codec:
        return talker
    return f"{talker}, decoder {codec.pop() if len(codec) == 1 else 'per job'}"


def windows_cell(w: dict[str, int]) -> str:
    """A job's windows for the summary: executed (their steps), how many an arrival cut
    short, and the steps arrivals had to themselves."""
    if not w:
        return "-"
    cell = f"{w.get('executed_windows', 0)} ({w.get('executed_steps', 0)})"
    if w.get("cut_windows"):
        cell += f", {w['cut_windows']} cut"
    if w.get("arrival_steps"):
        cell += f", {w['arrival_steps']} arrival steps"
    if w.get("audio_cycles"):
        cell += f", {w['audio_cycles']} held-audio cycles"
    return cell


def summarize(directory: Path) -> str:
    """Write summary.md and rtf.png (closed-loop jobs) or open_loop.png (open-loop jobs,
    bench/open_summary.py) into the sweep directory; return the summary."""
    from omniflow.bench.open_summary import open_loop_section  # it imports this module

    results = load_results(directory)
    opened = [r for r in results if "open_loop" in r]
    results = [r for r in results if "open_loop" not in r]
    if not results:  # an open-loop sweep
        text = open_loop_section(opened, directory, f"# Sweep {directory.name} (open loop)")
        (directory / "summary.md").write_text(text)
        return text
    swept = swept_keys(results)
    # prompts_per_lane gives each concurrency its own count: a column then, not the header
    counts = {r["config"]["num_prompts"] for r in results}
    per_job = len(counts) > 1 and "bench.num_prompts" not in swept  # else a column already
    head = [
        *swept,
        *(["prompts"] if per_job else []),
        "failed",
        "RTF median (min-max)",
        "first audio s",
        "e2e s",
        "audio-s/s",
        "steady audio-s/s",
        "worst underrun s",
        "talker ms/frame",
        "windows (steps)",
    ]
    rows = []
    for r in results:
        s = r["summary"]
        w = r.get("windows") or {}
        rtf = s["rtf"]
        rows.append(
            [
                *(override_value(r, k) for k in swept),
                *([str(r["config"]["num_prompts"])] if per_job else []),
                str(_failed(r)),
                f"{rtf['median']:.3f} ({rtf['min']:.3f}-{rtf['max']:.3f})" if rtf else "-",
                _num(s["ttfp_s"], "median", 3),
                _num(s["e2el_s"], "median", 2),
                _num(s["audio_throughput"], "median", 2),
                _num(s.get("steady_audio_throughput"), "median", 2),  # older results: none
                _num(s["underrun_s"], "max", 3),
                f"{r['talker_ms_per_frame']:.1f}" if r.get("talker_ms_per_frame") else "-",
                windows_cell(w),
            ]
        )
    first = results[0]
    table = "\n".join(
        ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        + ["| " + " | ".join(row) + " |" for row in rows]
    )
    cfg = first["config"]
    xlabel = swept[-1] if swept else "job"
    points = _points(results, swept)
    plot = plot_sweep(points, xlabel, directory / "rtf.png") if points else None
    prompts = (
        "prompts per round in the table"
        if len(counts) > 1
        else f"{cfg['num_prompts']} prompts per round"
    )
    text = (
        f"# Sweep {directory.name}\n\n{cfg['model']}, {cfg['pipeline']} pipeline, "
        f"{cfg['platform']} ({precision(results)}), {prompts}, "
        f"commit {first.get('commit') or '?'}, {first.get('date', '?')}.\n\n{table}\n"
        + (f"\n![median RTF and worst underrun per job]({plot.name})\n" if plot else "")
    )
    if opened:  # a sweep of both loops: the open-loop jobs under their own heading
        text += "\n" + open_loop_section(opened, directory, "## Open loop")
    (directory / "summary.md").write_text(text)
    return text


def _failed(result: dict[str, Any]) -> int:
    """Failed requests over the job's rounds (results from before failures were recorded
    have none: that client ended the job at the first failure)."""
    return sum(r.get("failed", 0) for r in result["rounds"])


def _num(stat: dict[str, float] | None, key: str, digits: int) -> str:
    return f"{stat[key]:.{digits}f}" if stat else "-"


def _points(results: list[dict[str, Any]], swept: list[str]) -> list[Point]:
    """x: the last swept key (or the job's order); one series per value of the others."""
    xkey = swept[-1] if swept else None
    points = []
    for i, r in enumerate(results):
        name = ", ".join(f"{k.rsplit('.', 1)[-1]}={override_value(r, k)}" for k in swept[:-1])
        s = r["summary"]
        if s["rtf"] is None:  # no request completed: nothing to plot
            continue
        points.append(
            Point(
                series=name or "median RTF",
                x=override_value(r, xkey) if xkey else str(i),
                rtf=s["rtf"]["median"],
                underrun_s=s["underrun_s"]["max"],
            )
        )
    return points
