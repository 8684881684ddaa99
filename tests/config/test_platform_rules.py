"""Platform rules (`config/resolve_platform.py`).

`platform.cudnn_benchmark`: `null` in `platform=cuda` resolves to on for the fused pipeline
(fixed decoder shapes) and off for the two-stage one (code2wav's chunk lengths vary, and cuDNN
would time every new shape: RTF 1.01 against 0.22 at c8 on the H200) and for a decoder primed
with voice-clone references (their frame counts vary); set on the process by `prepare_device`
on CUDA; refused on a platform without cuDNN. `platform.device_index`: refused where it
cannot act."""

from __future__ import annotations

import logging

import pytest
import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.errors import ConfigError
from omniflow.platforms.base import prepare_device

KEY = "platform.cudnn_benchmark"


def benchmark(*overrides: str) -> bool:
    return build_graph(compose(list(overrides))).platform.cudnn_benchmark


def test_null_is_on_for_fixed_shapes_and_off_where_a_stage_decodes_chunks():
    assert benchmark("platform=cuda", "pipeline=qwen3_tts_fused") is True
    assert benchmark("platform=cuda", "pipeline=qwen3_tts") is False
    # A Base model primes its decoder with the reference's frames, a count per request.
    assert benchmark("platform=cuda", "model=qwen3_tts_1_7b_base") is False
    primed_off = "pipeline.stages.talker.ref_context_frames=0"
    assert benchmark("platform=cuda", "model=qwen3_tts_1_7b_base", primed_off) is True
    assert benchmark("platform=cpu", "pipeline=qwen3_tts_fused") is False


def test_an_explicit_value_is_kept_and_true_with_chunks_is_warned_about(caplog):
    assert benchmark("platform=cuda", "pipeline=qwen3_tts_fused", f"{KEY}=false") is False
    with caplog.at_level(logging.WARNING, logger="omniflow.config.resolve_platform"):
        assert benchmark("platform=cuda", "pipeline=qwen3_tts", f"{KEY}=true") is True
    assert "code2wav" in caplog.text and KEY in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="omniflow.config.resolve_platform"):
        assert benchmark("platform=cuda", "pipeline=qwen3_tts_fused", f"{KEY}=true") is True
    assert caplog.text == ""


def test_refused_on_a_platform_without_cudnn():
    with pytest.raises(ConfigError) as exc:
        build_graph(compose(["platform=cpu", f"+{KEY}=true"]))
    assert exc.value.key == KEY


def test_prepare_device_sets_cudnn_benchmark_on_cuda_only():
    before = torch.backends.cudnn.benchmark
    try:
        prepare_device("cuda", cudnn_benchmark=True)
        assert torch.backends.cudnn.benchmark is True
        prepare_device("cuda")
        assert torch.backends.cudnn.benchmark is False
        torch.backends.cudnn.benchmark = True
        prepare_device("cpu", cudnn_benchmark=False)  # the CPU has no cuDNN to set
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = before
        torch.backends.cuda.enable_cudnn_sdp(True)


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_a_non_zero_device_index_is_refused_where_it_cannot_act(platform):
    """On the CPU it would be ignored; on CUDA the tensors would sit on that GPU while the
    engine threads launch kernels and replay graphs on device 0."""
    with pytest.raises(ConfigError) as exc:
        build_graph(compose([f"platform={platform}", "+platform.device_index=1"]))
    assert exc.value.key == "platform.device_index"
    assert platform != "cuda" or "CUDA_VISIBLE_DEVICES" in str(exc.value)
    assert build_graph(compose([f"platform={platform}", "+platform.device_index=0"]))


def codec_dtype(*overrides: str) -> str:
    return build_graph(compose(list(overrides))).platform.codec_dtype


def test_codec_dtype_is_the_models_else_the_platforms():
    """CUDA decodes in float16 unless asked (its bound: tests/codec_bound.py), the CPU in
    float32 (exact PCM); `model.codec_dtype` wins over `platform.codec_dtype`."""
    assert codec_dtype("platform=cuda") == "float16"
    assert codec_dtype("platform=cpu") == "float32"
    assert codec_dtype("platform=cuda", "model.codec_dtype=float32") == "float32"
    assert codec_dtype("platform=cuda", "platform.codec_dtype=bfloat16") == "bfloat16"
    assert codec_dtype("platform=cpu", "platform.codec_dtype=float16") == "float16"
    same = ("platform.codec_dtype=float32", "model.codec_dtype=float32")
    assert codec_dtype("platform=cuda", *same) == "float32"
    null = ("platform.codec_dtype=float32", "model.codec_dtype=null")
    assert codec_dtype("platform=cuda", *null) == "float32"


@pytest.mark.parametrize("name", ["dtype", "codec_dtype"])
def test_a_platform_dtype_the_models_would_override_is_refused(name):
    """Both set, to different values: the model's wins, so the platform's would be a key
    accepted and ignored."""
    with pytest.raises(ConfigError, match=rf"platform.{name}=float16 would not act: model"):
        compose([f"platform.{name}=float16", f"+model.{name}=bfloat16"])


def test_a_platform_dtype_an_overlays_model_dtype_overrides_is_refused_and_equal_ones_pass(
    tmp_path,
):
    """The model's value from an overlay wins as well; the same value however written is
    no conflict."""
    (tmp_path / "experiment").mkdir()
    overlay = "# @package _global_\nmodel:\n  dtype: float32\n"
    (tmp_path / "experiment" / "fp32.yaml").write_text(overlay)
    with pytest.raises(ConfigError, match="platform.dtype=bfloat16 would not act"):
        compose(["experiment=fp32", "platform=cpu", "platform.dtype=bfloat16"], tmp_path)
    assert compose(["model.dtype=float32", "platform.dtype='float32'"]).platform.dtype == "float32"
