"""The command line: one subcommand, then Hydra overrides (`key=value`, `group=option`).

Errors in the configuration are printed as one message (no traceback) on stderr and the
process exits with status 2, the convention for usage errors.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import yaml

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.errors import ConfigError

USAGE = """usage: python -m omniflow COMMAND [--config-dir DIR] [key=value ...]

commands:
  config   print the resolved, validated stage graph (YAML)
  serve    serve the OpenAI-compatible speech API
  synth    synthesise one text to a WAV file
  bench    benchmark (Hydra multirun sweeps with -m)
  sweep    summarise a sweep directory

Overrides are Hydra's: pipeline=qwen3_tts platform=cpu pipeline.stages.talker.window_k=4
experiment=high_concurrency. --config-dir DIR adds a directory of your own config groups
(e.g. DIR/experiment/mine.yaml, then experiment=mine).
"""

EXIT_USAGE = 2


@dataclass(frozen=True)
class Args:
    """Parsed command line."""

    command: str
    overrides: list[str]
    config_dir: str | None
    multirun: bool


def parse_args(argv: Sequence[str]) -> Args:
    """Split the command, our own flags and the Hydra overrides."""
    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit(_usage(0))
    command, rest = argv[0], list(argv[1:])
    overrides: list[str] = []
    config_dir: str | None = None
    multirun = False
    it = iter(rest)
    for arg in it:
        if arg in ("-m", "--multirun"):
            multirun = True
        elif arg == "--config-dir":
            config_dir = next(it, None)
            if config_dir is None:
                raise ConfigError("--config-dir", "needs a directory")
        elif arg.startswith("--config-dir="):
            config_dir = arg.split("=", 1)[1]
        elif arg in ("-h", "--help"):
            raise SystemExit(_usage(0))
        else:
            overrides.append(arg)
    return Args(command, overrides, config_dir, multirun)


def cmd_config(args: Args) -> int:
    """Print the resolved graph with every derived value."""
    graph = build_graph(compose(args.overrides, args.config_dir))
    sys.stdout.write(yaml.safe_dump(graph.to_dict(), sort_keys=False))
    return 0


def cmd_bench(args: Args) -> int:
    """One benchmark job, or with -m a sweep of jobs (omniflow/bench/)."""
    import json
    from pathlib import Path

    from omniflow.bench.job import run_job
    from omniflow.bench.sweep import default_sweep_dir, expand, summarize

    if not args.multirun:
        spec = compose(args.overrides, args.config_dir)
        out = Path(spec.bench.out_dir) if spec.bench.out_dir else None
        result = run_job(spec, args.overrides, out)
        print(json.dumps(result["summary"], indent=2))
        return 0
    jobs, swept = expand(args.overrides)
    specs = [compose(job, args.config_dir) for job in jobs]  # validate every job first
    for spec in specs:
        build_graph(spec)
    root = Path(specs[0].bench.out_dir) if specs[0].bench.out_dir else default_sweep_dir()
    root.mkdir(parents=True, exist_ok=True)
    (root / "sweep.json").write_text(json.dumps({"jobs": jobs, "swept": swept}, indent=2))
    log = logging.getLogger("omniflow.bench")
    for i, (job, spec) in enumerate(zip(jobs, specs, strict=True)):
        label = " ".join(o for o in job if o.partition("=")[0].lstrip("+") in swept) or "job"
        log.info("job %d/%d: %s", i + 1, len(jobs), label)
        result = run_job(spec, job, root / str(i))
        log.info("job %d/%d done: rtf %.3f", i + 1, len(jobs), result["summary"]["rtf"]["median"])
    print(summarize(root))
    print(f"results: {root}")
    return 0


def cmd_sweep(args: Args) -> int:
    """`sweep summarize DIR`: table (summary.md) and plot (rtf.svg) of a sweep directory."""
    from pathlib import Path

    from omniflow.bench.sweep import summarize

    if len(args.overrides) != 2 or args.overrides[0] != "summarize":
        print("usage: python -m omniflow sweep summarize DIR", file=sys.stderr)
        return EXIT_USAGE
    try:
        print(summarize(Path(args.overrides[1])))
    except FileNotFoundError as exc:
        print(f"omniflow sweep: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def cmd_synth(args: Args) -> int:
    """One offline request to a WAV file (omniflow/synth.py)."""
    from omniflow.synth import run_synth

    return run_synth(args.overrides, args.config_dir)


def cmd_serve(args: Args) -> int:
    """The OpenAI-compatible server (omniflow/serve/)."""
    from omniflow.serve.run import run_serve

    return run_serve(args.overrides, args.config_dir)


COMMANDS: dict[str, Callable[[Args], int]] = {
    "config": cmd_config,
    "serve": cmd_serve,
    "synth": cmd_synth,
    "bench": cmd_bench,
    "sweep": cmd_sweep,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    try:
        args = parse_args(argv)
        handler = COMMANDS.get(args.command)
        if handler is None:
            print(f"unknown command {args.command!r}\n\n{USAGE}", file=sys.stderr)
            return EXIT_USAGE
        return handler(args)
    except ConfigError as exc:
        print(f"omniflow: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _usage(code: int) -> int:
    (sys.stdout if code == 0 else sys.stderr).write(USAGE)
    return code
