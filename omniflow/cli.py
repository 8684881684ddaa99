"""The command line: one subcommand, then Hydra overrides (`key=value`, `group=option`).

A user error (a bad configuration, a missing device, a busy port, an unwritable output, a
Ctrl-C) is printed as one line on stderr, without a traceback, and the process exits with
status 2, the convention for usage errors. What a command needs of the machine is checked
before anything heavy is built (omniflow/preflight.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import yaml

from omniflow.cli_help import (
    CONFIG_HELP,
    SWEEP_HELP,
    USAGE,
    command_help,
    commands_with_help,
    common_help,
)
from omniflow.config.command_keys import check_command_keys, named_sections
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.errors import ConfigError
from omniflow.logs import setup_logging

EXIT_USAGE = 2
HYDRA_FLAGS = ("--cfg", "-c", "--info", "-i", "--resolve", "--package", "-p", "--hydra-help")
"""Hydra's own flags, handed to Hydra's application (bench); those before --package take
a value."""
_HYDRA_WITH_VALUE = ("--cfg", "-c", "--info", "-i", "--package", "-p")


class UsageError(Exception):
    """A command-line error that is not about the configuration (printed as is)."""


@dataclass(frozen=True)
class Args:
    """Parsed command line."""

    command: str
    overrides: list[str]
    config_dir: str | None
    multirun: bool
    help: bool = False
    hydra_flags: tuple[str, ...] = ()


def parse_args(argv: Sequence[str]) -> Args:
    """Split the command, our own flags, Hydra's flags and the Hydra overrides."""
    if not argv:  # no command: a usage error, the usage on stderr
        raise SystemExit(_usage(EXIT_USAGE))
    if argv[0] in ("-h", "--help"):
        raise SystemExit(_usage(0))
    command, rest = argv[0], list(argv[1:])
    overrides: list[str] = []
    hydra_flags: list[str] = []
    config_dir: str | None = None
    multirun = show_help = False
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
            show_help = True
        elif arg in HYDRA_FLAGS:
            hydra_flags.append(arg)
            if arg in _HYDRA_WITH_VALUE:
                value = next(it, None)
                if value is None:
                    raise UsageError(f"{arg} needs a value (e.g. {arg} job)")
                hydra_flags.append(value)
        else:
            overrides.append(arg)
    if command != "sweep":  # sweep takes words (`summarize DIR`); the rest key=value
        check_overrides(command, overrides)
    return Args(command, overrides, config_dir, multirun, show_help, tuple(hydra_flags))


def check_overrides(command: str, overrides: list[str]) -> None:
    """Every override is `key=value` (or Hydra's `~key`): a flag such as `--text` or a bare
    word such as `"Hello there"` would otherwise reach Hydra's override parser, which answers
    with a lexer error. Each is one line saying how to write it."""
    from omniflow.config.commands import SynthConfig

    synth_keys = SynthConfig.model_fields if command == "synth" else {}
    for i, item in enumerate(overrides):
        if item.startswith("-"):
            name = item.lstrip("-").partition("=")[0].replace("-", "_")
            if name in synth_keys:
                raise ConfigError(
                    f"synth.{name}",
                    f"keys are written key=value, not as the option {item.partition('=')[0]}: "
                    f'{name}="..."',
                )
            raise UsageError(
                f"unknown option {item!r}; `omniflow {command} --help` lists the keys, "
                "written key=value"
            )
        if "=" in item or item.startswith("~"):
            continue
        if command == "synth":
            before = overrides[i - 1] if i else ""
            if before.partition("=")[0].lstrip("+") in ("text", "synth.text"):
                said = before.partition("=")[2] + " " + item
                raise ConfigError(
                    "synth.text", f'{item!r} is not key=value: quote the whole text, text="{said}"'
                )
            raise ConfigError(
                "synth.text",
                f'{item!r} is not key=value; to speak it, write text="{item}"',
            )
        raise ConfigError(
            "", f"{item!r} is not a key=value override (e.g. server.port=9000 or platform=cpu)"
        )


def cmd_config(args: Args) -> int:
    """Print the resolved graph with every derived value."""
    spec = compose(args.overrides, args.config_dir)
    graph = build_graph(spec)
    data = graph.to_dict()
    if spec.deploy.name != "local":  # printed where it acts (docs/deploy.md)
        from omniflow.deploy.settings import printed, resolve_deploy

        data |= printed(resolve_deploy(spec.deploy, graph))
    for section in named_sections(args.overrides):  # a command's section, as overridden
        data[section] = getattr(spec, section).model_dump(mode="json")
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    return 0


def cmd_bench(args: Args) -> int:
    """One benchmark job, or with -m (or Hydra's flags) Hydra's application (a sweep)."""
    if args.multirun and {"--cfg", "-c", "--info", "-i"} & set(args.hydra_flags):
        raise UsageError("--cfg and --info show one job's config: leave out -m")
    if args.multirun or args.hydra_flags:
        from omniflow.bench.app import run_hydra_bench

        return run_hydra_bench(args.overrides, args.config_dir, args.multirun, args.hydra_flags)
    import json
    from pathlib import Path

    from omniflow.bench.target_check import bench_graph, check_target
    from omniflow.preflight import check_device, check_memory

    spec = compose(args.overrides, args.config_dir)
    graph = bench_graph(spec)
    check_target(spec, graph)  # deploy=ray: Ray found, the settings fit (docs/deploy.md)
    check_device(graph)
    check_memory(graph)
    from omniflow.bench.job import run_job  # the server and the client: after the checks

    out = Path(spec.bench.out_dir) if spec.bench.out_dir else None
    result = run_job(spec, args.overrides, out)
    print(json.dumps(result["summary"], indent=2))
    return 0


def cmd_sweep(args: Args) -> int:
    """`sweep summarize DIR`: table (summary.md) and plot (rtf.png, or open_loop.png) of a
    sweep directory."""
    from pathlib import Path

    from omniflow.bench.sweep import summarize

    if len(args.overrides) != 2 or args.overrides[0] != "summarize":
        raise UsageError("usage: omniflow sweep summarize DIR")
    try:
        print(summarize(Path(args.overrides[1])))
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    return 0


def cmd_synth(args: Args) -> int:
    """One offline request to an audio file (omniflow/synth.py)."""
    from omniflow.synth import run_synth

    return run_synth(args.overrides, args.config_dir)


def cmd_serve(args: Args) -> int:
    """The OpenAI-compatible server (omniflow/serve/), after the machine checks."""
    from omniflow.preflight import check_device, check_memory, check_port

    spec = compose(args.overrides, args.config_dir)
    graph = build_graph(spec)
    if spec.deploy.name == "ray":  # Ray Serve replicas (omniflow/deploy/, docs/deploy.md)
        from omniflow.deploy.preflight import check_deploy

        deploy = check_deploy(spec, graph)
    check_device(graph)
    check_port(spec.server)
    check_memory(graph)
    setup_logging(spec.server.log_level)
    if spec.deploy.name == "ray":
        from omniflow.deploy.launch import serve_on_ray

        return serve_on_ray(spec, deploy)

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
    setup_logging("info")
    command = argv[0] if argv else ""
    try:
        args = parse_args(argv)
        handler = COMMANDS.get(args.command)
        if handler is None:
            print(f"unknown command {args.command!r}\n\n{USAGE}", file=sys.stderr, end="")
            return EXIT_USAGE
        if args.help:
            return _command_help(args)
        if args.command != "sweep":
            check_command_keys(args.command, args.overrides)
        return handler(args)
    except ConfigError as exc:
        print(f"omniflow: invalid configuration: {exc}", file=sys.stderr)
    except UsageError as exc:
        print(f"omniflow {command}: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"omniflow {command}: interrupted", file=sys.stderr)
    return EXIT_USAGE


def entry() -> None:
    """The `omniflow` console script."""
    raise SystemExit(main())


def _command_help(args: Args) -> int:
    """`COMMAND --help`: the keys the command reads (sweep: its one verb; config: what it
    prints and the group choices)."""
    if args.command == "sweep":
        sys.stdout.write(SWEEP_HELP)
        return 0
    if args.command == "config":
        sys.stdout.write(CONFIG_HELP + common_help())
        return 0
    if args.command not in commands_with_help():
        return _usage(0)
    from omniflow.synth import synth_overrides

    overrides = synth_overrides(args.overrides) if args.command == "synth" else args.overrides
    sys.stdout.write(command_help(args.command, compose(overrides, args.config_dir)))
    return 0


def _usage(code: int) -> int:
    (sys.stdout if code == 0 else sys.stderr).write(USAGE)
    return code
