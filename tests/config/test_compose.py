"""Composition: typos, overlays and merge behaviour (docs/architecture.md: configuration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omniflow.config.compose import compose, validate
from omniflow.errors import ConfigError


def test_typo_on_the_command_line_names_the_key():
    with pytest.raises(ConfigError) as exc:
        compose(["pipeline.stages.talker.windw_k=4"])
    assert "windw_k" in str(exc.value)


def test_typo_added_with_plus_names_the_full_path():
    with pytest.raises(ConfigError) as exc:
        compose(["+pipeline.stages.talker.windw_k=4"])
    assert exc.value.key == "pipeline.stages.talker.windw_k"


def test_typo_in_a_yaml_overlay_names_the_key(tmp_path: Path):
    exp = tmp_path / "experiment"
    exp.mkdir()
    (exp / "typo.yaml").write_text(
        "# @package _global_\npipeline:\n  stages:\n    talker:\n      scheduler:\n"
        "        max_num_sqs: 4\n"
    )
    with pytest.raises(ConfigError) as exc:
        compose(["experiment=typo"], config_dir=tmp_path)
    assert exc.value.key == "pipeline.stages.talker.scheduler.max_num_sqs"


def test_overlay_setting_one_key_keeps_the_stage_sub_config(tmp_path: Path):
    exp = tmp_path / "experiment"
    exp.mkdir()
    (exp / "one_key.yaml").write_text(
        "# @package _global_\npipeline:\n  stages:\n    talker:\n      scheduler:\n"
        "        max_num_seqs: 7\n"
    )
    base = compose(["pipeline=qwen3_tts"]).pipeline.stages["talker"].scheduler
    spec = compose(["pipeline=qwen3_tts", "experiment=one_key"], config_dir=tmp_path)
    talker = spec.pipeline.stages["talker"]
    assert talker.scheduler.max_num_seqs == 7
    assert talker.scheduler.model_dump(exclude={"max_num_seqs"}) == base.model_dump(
        exclude={"max_num_seqs"}
    )
    assert talker.kind == "ar" and talker.arch == "qwen3_tts_talker"
    assert set(spec.pipeline.stages) == {"talker", "code2wav"}


def test_shipped_overlay_keeps_other_stage_keys():
    spec = compose(["pipeline=qwen3_tts", "experiment=high_concurrency"])
    talker = spec.pipeline.stages["talker"]
    assert talker.scheduler.max_num_seqs == 128
    assert talker.scheduler.max_model_len == 4096  # untouched by the overlay
    assert spec.pipeline.stages["code2wav"].upstream.chunk_frames == 25


def test_unknown_group_option_lists_the_choices():
    with pytest.raises(ConfigError) as exc:
        compose(["pipeline=nope"])
    assert "qwen3_tts_fused" in str(exc.value)


def test_missing_config_dir_is_an_error(tmp_path: Path):
    with pytest.raises(ConfigError) as exc:
        compose([], config_dir=tmp_path / "absent")
    assert exc.value.key == "--config-dir"


def test_wrong_kind_names_the_discriminator():
    data = compose(["pipeline=qwen3_tts"]).model_dump()
    data["pipeline"]["stages"]["code2wav"]["kind"] = "nonsense"
    with pytest.raises(ConfigError) as exc:
        validate(data)
    assert exc.value.key.startswith("pipeline.stages.code2wav")


def test_spec_is_frozen():
    spec = compose([])
    with pytest.raises(Exception) as exc:  # noqa: B017 - pydantic raises ValidationError
        spec.pipeline.stages["talker"].window_k = 3  # type: ignore[misc]
    assert "frozen" in str(exc.value)


@pytest.mark.parametrize("item", ["experiment=null", "~experiment", "platform=null"])
def test_a_config_group_without_an_option_is_refused_naming_its_options(item):
    """Hydra answers `experiment=null` with a traceback and `~experiment` with a failed
    interpolation (the pipelines' defaults name the experiment)."""
    with pytest.raises(ConfigError) as exc:
        compose([item])
    group = item.lstrip("~").partition("=")[0]
    assert exc.value.key == group
    assert "takes one of its options" in str(exc.value) and "leave it out" in str(exc.value)
    if group == "experiment":
        assert "high_concurrency, window_k12" in str(exc.value)


@pytest.mark.parametrize(
    ("override", "meant"),
    [
        (
            "pipeline.stages.talker.max_resident_seqs=null",
            "pipeline.stages.talker.scheduler.max_resident_seqs",
        ),
        (
            "pipeline.stages.talker.async_scheduling=false",
            "pipeline.stages.talker.scheduler.async_scheduling",
        ),
        ("model.num_layers=2", "model.code_predictor.num_layers or model.codec.num_layers"),
    ],
)
def test_a_key_written_a_level_too_high_is_found_below(override, meant):
    """Not only a near spelling at the key's own level: the same name further down."""
    with pytest.raises(ConfigError, match=f"did you mean {meant}"):
        compose(["platform=cpu", override])
