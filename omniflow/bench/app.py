"""`omniflow bench` as a Hydra application: `-m` is Hydra's multirun, so Hydra's sweeper
expands the comma-separated values, its launcher runs the jobs (in this process by default;
`hydra/launcher=joblib` in parallel, or ray/submitit on a cluster), each job gets
`<sweep dir>/<n>/` with Hydra's `.hydra/` record, and `--cfg job`, `--info`,
`--hydra-help` work as in any Hydra app. The `SweepSummary` callback (sweep.py, registered
in omniflow/conf/config.yaml) writes the table and plots when the sweep ends.

Before Hydra runs anything, every job's configuration is validated (one bad combination
fails the sweep at once) and a sweep directory that already holds results is refused, so
re-running a committed sweep's command never overwrites what was committed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from omniflow.bench.mode import check_mode
from omniflow.bench.prompt_file import check_bench_prompts
from omniflow.bench.sweep import sweep_jobs
from omniflow.bench.target_check import bench_graph, check_target
from omniflow.config.compose import CONF_DIR, compose, plus_sets, to_data, validate
from omniflow.errors import ConfigError
from omniflow.preflight import check_device, check_memory


def run_hydra_bench(
    overrides: list[str], config_dir: str | None, multirun: bool, hydra_flags: tuple[str, ...]
) -> int:
    """Run Hydra's application with the command line it would have been given."""
    # keys set as `compose` takes them; a prompt file found wherever the job runs
    argv = [*hydra_flags, *plus_sets(absolute_prompts(overrides))]
    if multirun:
        jobs = sweep_jobs(overrides)
        for job in jobs:  # validate every job first
            spec = compose(job, config_dir)
            graph = bench_graph(spec)
            check_mode(spec.bench)
            check_bench_prompts(spec.bench)
            check_target(spec, graph)  # deploy=ray: what it cannot do, refused now
            check_memory(graph)  # each job's (a sweep may vary num_kv_blocks or the model)
        check_device(graph)
        key, sweep_dir = _sweep_dir(overrides)
        if sweep_dir is not None:
            _refuse_existing_results(sweep_dir)
        if key == "bench.out_dir":
            argv.append(f"hydra.sweep.dir={sweep_dir}")
        argv.insert(0, "--multirun")
    if config_dir is not None:
        argv += ["--config-dir", str(Path(config_dir).resolve())]
    saved = sys.argv
    sys.argv = ["omniflow bench", *argv]
    try:
        _bench_app()
    finally:
        sys.argv = saved
    return 0


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def _bench_app(cfg: DictConfig) -> float:
    """One job: the composed config -> run_job. Returns the median RTF, or in open loop the
    p95 first audio in ms (Hydra records it)."""
    from omniflow.bench.job import run_job

    spec = validate(to_data(cfg))
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        out: Path | None = Path(hc.runtime.output_dir)
    else:
        out = Path(spec.bench.out_dir) if spec.bench.out_dir else None
    result = run_job(spec, list(hc.overrides.task), out)
    if hc.mode != RunMode.MULTIRUN:
        print(json.dumps(result["summary"], indent=2))
    if "open_loop" in result:  # the open loop's figure of merit: p95 first audio
        return float(result["open_loop"]["first_audio_ms"]["p95"] or "nan")
    return float(result["summary"]["rtf"]["median"])


def absolute_prompts(overrides: list[str]) -> list[str]:
    """`bench.prompts=FILE` (each of a sweep's FILE,FILE) as absolute paths: a job may run in
    a directory of its own (`hydra.job.chdir=true`), where a relative path names nothing."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.lstrip("+") == "bench.prompts" and value not in ("", "null"):
            item = key + "=" + ",".join(str(Path(v).resolve()) for v in value.split(","))
        out.append(item)
    return out


def _sweep_dir(overrides: list[str]) -> tuple[str | None, str | None]:
    """The key and directory the user named the sweep directory with (`hydra.sweep.dir=`
    wins over `bench.out_dir=`); (None, None) for Hydra's default, a new multirun/DATE_TIME."""
    named: dict[str, str] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        if key in ("hydra.sweep.dir", "bench.out_dir") and value not in ("", "null"):
            named[key] = value
    for key in ("hydra.sweep.dir", "bench.out_dir"):
        if key in named:
            return key, named[key]
    return None, None


def _refuse_existing_results(sweep_dir: str) -> None:
    found = sorted(Path(sweep_dir).glob("*/result.json"))
    if found:
        raise ConfigError(
            "hydra.sweep.dir",
            f"{sweep_dir} already holds {len(found)} job results; a sweep never overwrites "
            "results (committed sweeps included): name a new directory, or leave it out for "
            "multirun/DATE_TIME",
        )
