"""`benchmarks.pipeline_args`: the drivers' presets and overrides compose as `omniflow serve`'s."""

from __future__ import annotations

import pytest

from benchmarks.pipeline_args import pipeline_parser, spec_of
from omniflow.errors import ConfigError


def test_presets_and_overrides_reach_the_composed_config():
    args = pipeline_parser("doc").parse_args(
        ["--platform", "cpu", "--override", "pipeline.stages.talker.window_k=3", "--override",
         "server.max_first_audio_wait_s=null"]
    )  # fmt: skip
    spec = spec_of(args)
    assert spec.platform.name == "cpu" and spec.model.name == "qwen3-tts-tiny"
    assert spec.pipeline.stages["talker"].window_k == 3
    assert spec.server.max_first_audio_wait_s is None


def test_a_bad_override_names_its_key():
    args = pipeline_parser(None).parse_args(["--override", "server.port=70000"])
    with pytest.raises(ConfigError, match="server.port"):
        spec_of(args)
