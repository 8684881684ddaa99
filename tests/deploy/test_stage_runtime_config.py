"""`pipeline.runtime` (no Ray cluster needed): `ray` printed resolved on the two-stage
pipeline; refused, each in one line naming the key with exit status 2, on the fused pipeline
(one stage: nothing to place apart), with `deploy=ray`, without Ray installed (before any
build), on a cluster too small for one device per stage, and the old, never-built
`process_per_stage`."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from omniflow import cli
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.errors import ConfigError

TWO = ["pipeline=qwen3_tts", "platform=cpu"]


def one_line(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_config_prints_ray_on_the_two_stage_pipeline(capsys):
    assert cli.main(["config", *TWO, "pipeline.runtime=ray"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["runtime"] == "ray" and list(printed["stages"]) == ["talker", "code2wav"]


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["platform=cpu", "pipeline.runtime=ray"], "has one stage (fused)"),
        ([*TWO, "pipeline.runtime=ray", "deploy=ray"], "inside deploy=ray replicas is not built"),
        (
            [*TWO, "pipeline.runtime=process_per_stage"],
            "should be 'in_process', 'process' or 'ray'",
        ),
        (["platform=cpu", "pipeline.runtime=process", "deploy=ray"], "process (the engine in a"),
    ],
)
def test_refusals_are_one_line_naming_the_key(capsys, overrides, words):
    err = one_line(capsys, ["config", *overrides])
    assert "pipeline.runtime" in err and words in err


def test_without_ray_a_command_is_one_line_before_any_build(capsys, monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    monkeypatch.setattr("omniflow.build.pipeline.build_context", _must_not_run)
    out = tmp_path / "a.wav"
    err = one_line(capsys, ["synth", *TWO, "pipeline.runtime=ray", f"synth.out={out}"])
    assert "pipeline.runtime: pipeline.runtime=ray needs Ray" in err
    assert 'pip install "omniflow[ray]"' in err and not out.exists()


def _must_not_run(*_):
    raise AssertionError("built without Ray")


def test_a_cluster_without_a_device_per_stage_is_refused(monkeypatch):
    ray = pytest.importorskip("ray")
    from omniflow.deploy.stage_pipeline import check_cluster_fits, stage_options

    graph = build_graph(compose([*TWO, "pipeline.runtime=ray"]))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0})
    with pytest.raises(ConfigError, match=r"2 stages on its own CPU \(2 in all\).* has 1"):
        check_cluster_fits(graph, stage_options(graph))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    check_cluster_fits(graph, stage_options(graph))


@pytest.mark.parametrize(
    ("overrides", "runtime"),
    [
        (["platform=cuda"], "process"),  # served on the GPU: the engine beside the server
        (["platform=cuda", "pipeline=qwen3_tts"], "process"),
        (["platform=cpu"], "in_process"),
        (["platform=cuda", "deploy=ray"], "in_process"),  # a replica is a process already
        (["platform=cuda", "bench.phase_timing=device"], "process"),  # a bench key: not here
        (["platform=cuda", "pipeline.runtime=in_process"], "in_process"),  # a value wins
        (["platform=cpu", "pipeline.runtime=process"], "process"),
    ],
)
def test_the_shipped_null_resolves_by_platform_deploy_and_phase_timing(overrides, runtime):
    assert build_graph(compose(overrides)).runtime == runtime


def test_config_prints_the_resolved_runtime_and_it_is_settable_as_printed(capsys):
    assert cli.main(["config", "platform=cuda"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["runtime"] == "process"
    assert cli.main(["config", "platform=cuda", f"pipeline.runtime={printed['runtime']}"]) == 0


@pytest.mark.parametrize(
    ("overrides", "runtime"),
    [
        (["platform=cuda"], "process"),
        (["platform=cuda", "bench.phase_timing=device"], "in_process"),  # timed in the job
        (["platform=cuda", "bench.phase_timing=device", "pipeline.runtime=process"], "process"),
    ],
)
def test_a_bench_job_keeps_the_engine_where_it_times_the_device(overrides, runtime):
    from omniflow.bench.target_check import bench_graph

    assert bench_graph(compose(overrides)).runtime == runtime
    assert build_graph(compose(overrides), engine_here=True).runtime == (
        "process" if "pipeline.runtime=process" in overrides else "in_process"
    )


def test_synth_keeps_the_engine_in_its_own_process_on_cuda(monkeypatch, tmp_path):
    """No server shares synth's interpreter: the null stays in_process on CUDA too (checked
    on this machine by stopping at the build, before any device is touched)."""
    import omniflow.build.pipeline
    import omniflow.synth
    from omniflow.synth import SynthError

    built = []

    def stop(graph, *_):
        built.append(graph.runtime)
        raise SynthError("stopped at the build", status=3)

    monkeypatch.setattr(omniflow.synth, "check_device", lambda graph: None)
    monkeypatch.setattr(omniflow.build.pipeline, "build_pipeline", stop)
    out = tmp_path / "a.wav"
    assert cli.main(["synth", "platform=cuda", f"synth.out={out}"]) == 3
    assert built == ["in_process"]
