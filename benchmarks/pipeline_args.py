"""The in-process drivers' shared command line: the model, platform and pipeline presets plus
Hydra overrides, composed and validated as `omniflow serve` composes them (one place, so
the drivers name and read them alike)."""

from __future__ import annotations

import argparse

from omniflow.config.compose import compose
from omniflow.config.schema import OmniflowSpec


def pipeline_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser with `--model`, `--platform`, `--pipeline` and repeatable `--override`."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="qwen3_tts_tiny")
    ap.add_argument("--platform", default="auto")
    ap.add_argument("--pipeline", default="qwen3_tts_fused")
    ap.add_argument("--override", action="append", default=[], help="a Hydra override")
    return ap


def spec_of(args: argparse.Namespace) -> OmniflowSpec:
    """The validated config the parsed arguments name, the engine in this process (the
    drivers time and hook its steps here; on CUDA the served default is an engine process)."""
    base = [f"model={args.model}", f"platform={args.platform}", f"pipeline={args.pipeline}"]
    base.append("pipeline.runtime=in_process")
    return compose(base + list(args.override))
