"""`omniflow COMMAND --help`: what a command does and the keys it reads, with their values.

The values are those of the configuration the rest of the command line composes (so
`omniflow serve experiment=high_concurrency --help` shows that overlay's values), and the
descriptions are the schema's: the help cannot drift from what the command accepts.
"""

from __future__ import annotations

from pydantic import BaseModel

from omniflow.config.command_keys import SECTIONS, SYNTH_SERVER_KEYS, acts
from omniflow.config.commands import BenchConfig, SynthConfig
from omniflow.config.compose import CONF_DIR
from omniflow.config.deploy_schema import DeployConfig
from omniflow.config.schema import OmniflowSpec, ServerConfig

USAGE = """usage: omniflow COMMAND [--config-dir DIR] [key=value ...]
       (or: python -m omniflow COMMAND ...)

commands:
  config   print the resolved, validated stage graph (YAML)
  serve    serve the OpenAI-compatible speech API
  synth    synthesise one text to an audio file
  bench    benchmark over HTTP on loopback (a Hydra multirun sweep with -m)
  sweep    summarise a sweep directory: omniflow sweep summarize DIR

`omniflow COMMAND --help` lists the keys a command reads. Overrides are Hydra's:
pipeline=qwen3_tts platform=cpu pipeline.stages.talker.window_k=4 experiment=high_concurrency.
--config-dir DIR adds a directory of your own config groups (e.g. DIR/experiment/mine.yaml,
then experiment=mine).
"""

CHOICE_GROUPS = ("pipeline", "model", "platform", "experiment", "deploy")
"""The config groups a user chooses from (`receiver` follows the pipeline, `hydra` is
Hydra's own)."""


def common_help(command: str = "config") -> str:
    """The group choices `command` reads, read from the shipped config directory so that
    every preset is named (a list written by hand drifted)."""
    choices = [
        f"{group}={'|'.join(sorted(p.stem for p in (CONF_DIR / group).glob('*.yaml')))}"
        for group in CHOICE_GROUPS
        if group not in SECTIONS or acts(command, group)
    ]
    return (
        "\nAny other override configures what runs (a group choice, or a.b.c=value as "
        "`omniflow config` prints it):\n"
        + "".join(f"  {c}\n" for c in choices)
        + "  model.path=DIR (a checkpoint)\n"
    )


CONFIG_HELP = """usage: omniflow config [--config-dir DIR] [key=value ...]

Print the resolved stage graph as YAML: the pipeline's name, runtime and final stage, each
stage with its per-stage values resolved (window_k, stream decode, audio chunk frames,
reference context frames, ...), the platform and the model (and deploy, with deploy=ray).
A key printed under stages or runtime is set under pipeline. (stages.talker.window_k:
pipeline.stages.talker.window_k=4), any other as printed (model.codec_dtype=float32); a
derived key (final_stage, a stage's output, ...) is refused, naming what to set instead. A
mistyped key fails with its path and the nearest valid key. The server's, synth's and the
bench's keys: omniflow serve|synth|bench --help.
"""

_HEADS = {
    "serve": "usage: omniflow serve [key=value ...]\n\nServe the OpenAI-compatible speech API "
    "(POST /v1/audio/speech, GET /v1/models,\n/health, /metrics, /docs).\n\nkeys:",
    "synth": 'usage: omniflow synth [text="..."] [out=FILE] [key=value ...]\n\nSynthesise one '
    "text to an audio file; the format follows out's extension\n(.wav, .flac, .mp3, .opus, "
    ".ogg, .pcm or .raw). text and out default to the values below\n(an existing out "
    "is replaced). Progress goes to stderr; the summary line to stdout.\nVoice clone (a Base "
    'model):\nref_audio=FILE ref_text="..." or ref_audio=FILE x_vector_only_mode=true.\n\nkeys '
    "(bare, or as "
    "synth.KEY):",
    "bench": "usage: omniflow bench [-m] [hydra flags] [key=value ...]\n\nServe the "
    "configured pipeline on loopback and load it over HTTP with the shipped LibriSpeech "
    "prompts\n(fixed length: EOS ignored). With -m, a Hydra multirun: comma-separated values "
    "sweep,\none job per combination, then DIR/summary.md and DIR/rtf.png (open loop, "
    "bench.rps: DIR/open_loop.png). Hydra's flags "
    "work:\n--cfg job (print a job's config), --hydra-help, hydra/launcher=joblib (needs the "
    "[bench] extra),\nhydra.sweep.dir=DIR (default multirun/DATE_TIME; an existing results "
    "directory is refused).\n\nkeys:",
}

SWEEP_HELP = """usage: omniflow sweep summarize DIR

Summarise a sweep directory (what `omniflow bench -m` writes: DIR/<n>/result.json per job):
write DIR/summary.md (a table of the jobs, the swept keys as columns) and a plot (needs
matplotlib, the [bench] extra): DIR/rtf.png, median RTF and worst player underrun per job,
or for an open-loop sweep (bench.rps) DIR/open_loop.png, p95 first audio and stalled
fraction against req/s; and print the table. A sweep writes both itself when it ends;
this redoes them, e.g. for a committed sweep in sweeps/.
"""

_SECTIONS: dict[str, tuple[str, type[BaseModel], str]] = {
    "serve": ("server", ServerConfig, "server."),
    "synth": ("synth", SynthConfig, ""),
    "bench": ("bench", BenchConfig, "bench."),
}


_DEPLOY_HEAD = "\ndeploy keys (they act with deploy=ray; docs/deploy.md):"


def command_help(command: str, spec: OmniflowSpec | None) -> str:
    """The help text of `serve`, `synth` or `bench`; `spec` gives the current values.
    `serve` also lists the deploy keys (`serve deploy=ray` runs replicas on Ray)."""
    section, model, prefix = _SECTIONS[command]
    lines = [_HEADS[command]]
    lines += _keys(model, getattr(spec, section) if spec is not None else None, prefix)
    if command == "serve":
        deploy = spec.deploy if spec is not None else None
        lines += [_DEPLOY_HEAD, *_keys(DeployConfig, deploy, "deploy.", skip=("name",))]
    if command == "synth":  # the one server key synth reads (its text's limit)
        server = spec.server if spec is not None else None
        lines += ["\nserver keys synth reads:"]
        lines += _keys(ServerConfig, server, "server.", only=SYNTH_SERVER_KEYS)
    return "\n".join(lines) + "\n" + common_help(command)


def _keys(
    model: type[BaseModel],
    current: BaseModel | None,
    prefix: str,
    skip: tuple[str, ...] = (),
    only: frozenset[str] | None = None,
) -> list[str]:
    """Each field (of `only`, where given) as `prefix + name=value` (the current value, else
    the default) and its description."""
    values = current.model_dump() if current is not None else {}
    lines = []
    for name, field in model.model_fields.items():
        if name in skip or (only is not None and name not in only):
            continue
        value = values.get(name, field.default)
        shown = (
            "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        )
        lines.append(f"  {prefix}{name}={shown}")
        lines.append(f"      {field.description}")
    return lines


def commands_with_help() -> tuple[str, ...]:
    return tuple(_SECTIONS)
