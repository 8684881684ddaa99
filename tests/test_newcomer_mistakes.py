"""Issue 36: a newcomer's first commands. Each mistake is refused before anything is built
(in one line, exit status 2, from the command line), with the server's request rules applied
to `synth`; and the rough edges: output file modes, a Base model's hint, help texts."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys

import pytest
import torch

import omniflow.build.pipeline as build
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.errors import ConfigError, ConfigErrors
from omniflow.synth import run_synth

ARGS = ["platform=cpu", "seed=3"]


def omniflow(*args: str, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    def preexec() -> None:
        if umask is not None:
            os.umask(umask)

    return subprocess.run(
        [sys.executable, "-m", "omniflow", *args],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=preexec,
    )


def one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("omniflow: invalid configuration: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_build(monkeypatch):
    """The pipeline must not be built: every refusal here comes before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the pipeline was built for a request it must refuse")

    monkeypatch.setattr(build, "build_pipeline", refuse)


def refused(tmp_path, *extra: str) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        run_synth([*ARGS, *extra, f"out={tmp_path / 'x.wav'}"], None)
    assert list(tmp_path.iterdir()) == []
    return exc.value


# --------------------------------------------------------------------------- item 1


def test_a_base_model_without_a_reference_is_refused(tmp_path, no_build):
    err = refused(tmp_path, "model=qwen3_tts_tiny_base", "text=Hello", "x_vector_only_mode=true")
    assert err.key == "synth.ref_audio" and "needs ref_audio" in err.reason


def test_a_preset_voice_on_a_base_model_is_refused(tmp_path, no_build):
    err = refused(tmp_path, "model=qwen3_tts_tiny_base", "text=Hello", "voice=vivian")
    assert err.key == "synth.voice" and "no preset speakers" in err.reason


def test_the_base_model_refusals_are_one_line():
    r = omniflow("synth", "model=qwen3_tts_tiny_base", "text=Hello", "out=x.wav")
    one_line_error(r, "synth.ref_audio", "needs ref_audio")
    r = omniflow("synth", "model=qwen3_tts_tiny_base", "text=Hi", "voice=vivian", "out=x.wav")
    one_line_error(r, "synth.voice", "no preset speakers")


# --------------------------------------------------------------------------- item 2


def test_a_real_size_preset_without_a_checkpoint_needs_an_opt_in_on_the_cpu():
    for args in (("synth", "text=Hi", "out=x.wav"), ("serve", "server.port=0")):
        r = omniflow(*args, "model=qwen3_tts_1_7b", "platform=cpu")
        line = one_line_error(r, "model.path", "model.allow_large_dummy=true", "GB")
        assert "noise, not speech" in line


def test_the_estimate_counts_weights_and_the_kv_cache():
    """The 1.7B preset measured 15.9 GB peak RSS as a CPU build (issue 36): 2.03 B fp32
    parameters (8.1 GB) and 2,048 KV blocks of 16 tokens x 28 layers x K and V x 8 heads x
    128 x 4 bytes (7.5 GB), plus the process."""
    from omniflow.preflight import GB, memory_estimate

    graph = build_graph(compose(["platform=cpu", "model=qwen3_tts_1_7b"]))
    need = memory_estimate(graph)
    assert 8.0 * GB < need.weights < 8.3 * GB
    assert need.kv_cache == (2048 * 16 + 1) * 28 * 2 * 8 * 128 * 4
    assert 15.5 * GB < need.total < 16.5 * GB
    tiny = memory_estimate(build_graph(compose(["platform=cpu"])))
    assert tiny.weights + tiny.kv_cache < 0.1 * GB  # no opt-in for the default


def test_the_estimate_counts_the_codec_in_the_dtype_it_is_built_in():
    """The decoder's weights at the resolved codec dtype (float16 where the platform says
    so), not the model key alone: the two estimates differ by half the codec's fp32 bytes."""
    from omniflow.build.checks import parameter_counts
    from omniflow.preflight import memory_estimate

    graph = build_graph(compose(["platform=cpu"]))
    half = build_graph(compose(["platform=cpu", "platform.codec_dtype=float16"]))
    codec = parameter_counts(graph.model)["codec"]
    assert memory_estimate(graph).weights - memory_estimate(half).weights == 2 * codec


def test_a_build_that_does_not_fit_is_refused(monkeypatch):
    import omniflow.preflight as preflight
    from omniflow.preflight import GB, check_memory

    monkeypatch.setattr(preflight, "available_memory", lambda: (int(4 * GB), "test"))
    big = ["platform=cpu", "model=qwen3_tts_0_6b", "model.allow_large_dummy=true"]
    with pytest.raises(ConfigError) as exc:
        check_memory(build_graph(compose(big)))
    assert exc.value.key == "model" and "4.0 GB is available" in exc.value.reason
    assert "pipeline.stages.talker.scheduler.num_kv_blocks=2048" in exc.value.reason
    check_memory(build_graph(compose(["platform=cpu"])))  # the tiny default fits


def test_the_opt_in_is_refused_where_it_cannot_act():
    with pytest.raises(ConfigError) as exc:
        build_graph(compose(["platform=cuda", "model.allow_large_dummy=true"]))
    assert exc.value.key == "model.allow_large_dummy"


# --------------------------------------------------------------------------- item 3


@pytest.mark.parametrize("text", ["   ", "", "\u200b \t"])
def test_blank_text_is_refused_before_the_build(tmp_path, no_build, text):
    err = refused(tmp_path, f"text={text}")
    assert err.key == "synth.text" and "text is empty" in err.reason


def test_blank_text_is_one_line():
    one_line_error(omniflow("synth", "text=", "out=x.wav"), "synth.text", "empty")


# --------------------------------------------------------------------------- item 4


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--text", "Hello", "out=x.wav"), 'not as the option --text: text="..."'),
        (("Hello there",), 'to speak it, write text="Hello there"'),
        (("text=Hello", "there"), 'quote the whole text, text="Hello there"'),
    ],
)
def test_text_not_written_key_value_says_how(args, says):
    one_line_error(omniflow("synth", *args), "synth.text", says)


# --------------------------------------------------------------------------- item 6


def test_ignore_eos_without_a_length_is_refused(tmp_path, no_build):
    err = refused(tmp_path, "text=Hi", "ignore_eos=true")
    assert err.key == "synth.ignore_eos" and "needs max_new_tokens" in err.reason


def test_every_error_of_a_request_is_reported(tmp_path, no_build):
    with pytest.raises(ConfigErrors) as exc:
        run_synth([*ARGS, "text= ", "voice=nobody", "language=xx", "out=x.wav"], None)
    keys = [e.key for e in exc.value.errors]
    assert keys == ["synth.text", "synth.voice", "synth.language"]


# --------------------------------------------------------------------------- item 7


def test_synth_output_follows_the_umask(tmp_path):
    out = tmp_path / "x.wav"
    r = omniflow("synth", "platform=cpu", "text=Hi.", f"out={out}", umask=0o022)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    out.chmod(0o600)  # an existing file keeps its mode when it is written again
    assert run_synth(["platform=cpu", "text=Hi.", f"out={out}"], None) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


# --------------------------------------------------------------------------- item 9


def test_a_base_model_s_dummy_warning_names_a_base_preset(caplog):
    from omniflow.models.qwen3_tts.factory import build_talker

    model = build_graph(compose(["platform=cpu", "model=qwen3_tts_tiny_base"])).model
    with caplog.at_level(logging.WARNING):
        build_talker(model, torch.device("cpu"))
    assert "model=qwen3_tts_1_7b_base model.path=DIR" in caplog.text


# --------------------------------------------------------------------------- item 12


def test_sweep_help_shows_summarize():
    r = omniflow("sweep", "--help")
    assert r.returncode == 0 and "omniflow sweep summarize DIR" in r.stdout


def test_the_sweep_dir_refusal_names_the_default_directory(tmp_path):
    from omniflow.bench.app import _refuse_existing_results

    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "result.json").write_text("{}")
    with pytest.raises(ConfigError) as exc:
        _refuse_existing_results(str(tmp_path))
    assert "multirun/DATE_TIME" in exc.value.reason
