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


def _not_yet(name: str) -> Callable[[Args], int]:
    def run(args: Args) -> int:
        build_graph(compose(args.overrides, args.config_dir))
        print(f"omniflow {name}: not available in this version yet", file=sys.stderr)
        return 1

    return run


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
    "bench": _not_yet("bench"),
    "sweep": _not_yet("sweep"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
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
