"""Every key `omniflow config` prints can be set as printed, to the value printed, without
Hydra's `+` (issue 36): the shipped YAML lists every key of the schema, so `key=value`
overrides it. A printed key that is derived from others is refused in one line saying so and
naming what to set instead. (The printed tree holds the stages and the runtime at its top;
they are set under `pipeline.`.)"""

from __future__ import annotations

from typing import Any

import pytest

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.errors import ConfigError

DERIVED = {
    "final_stage",
    "platform.device",
    "name",
    "receives_chunks",
    "atomic_chunks",
    "output",
    "downstream",
    "is_final",
}
"""Printed, not settable (a stage's own keys by their last part)."""
CASES = [
    ["pipeline=qwen3_tts_fused", "platform=cpu"],
    ["pipeline=qwen3_tts", "platform=cpu"],
    ["pipeline=qwen3_tts_fused", "platform=cpu", "model=qwen3_tts_tiny_base"],
    ["pipeline=qwen3_tts", "platform=cpu", "model=qwen3_tts_1_7b_base"],
    ["pipeline=qwen3_tts_fused", "platform=cuda", "model=qwen3_tts_0_6b"],
    ["pipeline=qwen3_tts", "platform=npu"],
]


def leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in leaves(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), node)]


def as_override(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def key_of(printed: str) -> str:
    """The override key of a printed key (stages and runtime live under `pipeline.`)."""
    if printed.startswith("stages.") or printed == "runtime":
        return "pipeline." + printed
    return printed


def printed(case: list[str]) -> list[tuple[str, Any]]:
    try:
        return leaves(build_graph(compose(case)).to_dict())
    except ConfigError as exc:  # npu without torch_npu: the graph's keys are the cpu one's
        assert "torch_npu" in str(exc)
        return leaves(build_graph(compose([*case[:-1], "platform=cpu"])).to_dict())


@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_every_printed_key_is_settable_to_its_printed_value(case):
    overrides = [
        f"{key_of(path)}={as_override(value)}"
        for path, value in printed(case)
        if path != "pipeline" and path not in DERIVED and path.rsplit(".", 1)[-1] not in DERIVED
    ]
    try:  # all at once (one composition); on a failure, one by one to name every key
        compose([*case, *overrides])
    except ConfigError:
        failures = []
        for override in overrides:
            try:
                compose([*case, override])
            except ConfigError as exc:
                failures.append(f"{override}: {exc}")
        assert failures == []


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("final_stage=talker", "pipeline.stages"),
        ("pipeline.final_stage=talker", "pipeline.stages"),
        ("platform.device=cpu", "platform.name"),
        ("pipeline.stages.talker.is_final=true", "pipeline.stages"),
        ("pipeline.stages.talker.output=audio", "stream_decode"),
        ("pipeline.stages.talker.receives_chunks=false", "upstream"),
        ("+pipeline.stages.talker.name=talker", "stage's key"),
        ("stages.talker.window_k=0", "pipeline.stages.talker.window_k"),
        ("runtime=in_process", "pipeline.runtime"),
    ],
)
def test_a_derived_key_is_refused_saying_what_to_set(override, names):
    with pytest.raises(ConfigError) as exc:
        compose(["platform=cpu", override])
    message = str(exc.value)
    assert "\n" not in message and names in message, message
    assert "omniflow config prints" in message, message


def test_audio_chunk_frames_prints_what_it_takes():
    """`0` (printed where null resolves to it: no CUDA graphs) means one pass at the window's
    end on the main stream."""
    graph = build_graph(compose(["platform=cpu", "pipeline.stages.talker.audio_chunk_frames=0"]))
    assert graph.stages["talker"].audio_chunk_frames == 0


def test_platform_gpu_suggests_cuda():
    with pytest.raises(ConfigError) as exc:
        compose(["platform=gpu"])
    assert "did you mean platform=cuda?" in str(exc.value)


def test_a_resource_entry_is_set_as_printed():
    """`omniflow config deploy=ray` prints `deploy.resources_per_replica.CPU`; the YAML's
    null has no such entry, yet the key works as printed (Hydra alone wants `+`)."""
    spec = compose(["platform=cpu", "deploy=ray", "deploy.resources_per_replica.CPU=2.0"])
    assert spec.deploy.resources_per_replica == {"CPU": 2.0}
    spec = compose(["platform=cpu", "deploy=ray", "+deploy.resources_per_replica.GPU=1"])
    assert spec.deploy.resources_per_replica == {"GPU": 1.0}


@pytest.mark.parametrize(
    "override", ["deploy.resources_per_replica.CPU=3", "+platform.cuda_graphs=false"]
)
def test_keys_set_as_compose_takes_them_also_reach_the_bench_app(override, capsys):
    """`omniflow bench --cfg job` (and -m) hands the overrides to Hydra's application, not to
    `compose`: the same key must be taken there as written."""
    from omniflow import cli

    assert cli.main(["bench", "--cfg", "job", "platform=cpu", "deploy=ray", override]) == 0
    out = capsys.readouterr().out
    assert "CPU: 3" in out if "CPU" in override else "cuda_graphs: false" in out


@pytest.mark.parametrize(
    ("overrides", "hint"),
    [
        (["port=9000"], "did you mean server.port?"),
        (["+port=9000"], "did you mean server.port?"),
        (["window_k=4"], "did you mean pipeline.stages.talker.window_k?"),
        (["seed=3"], "did you mean bench.seed or model.seed or synth.seed?"),  # not "server"
        (["name=x"], "keys start with one of: bench, deploy, model, pipeline"),  # too many
        (
            ["pipeline.stages.code2wav.window_k=4"],
            "pipeline qwen3_tts_fused has no stage 'code2wav' (its stages: talker)",
        ),
        (
            ["+pipeline.stages.code2wav.window_k=4"],
            "pipeline qwen3_tts_fused has no stage 'code2wav' (its stages: talker)",
        ),
        (
            ["pipeline=qwen3_tts", "pipeline.stages.code2wav.scheduler.block_size=4"],
            "pipeline.stages.code2wav.scheduler has no key 'block_size' (its keys: "
            "async_scheduling, max_num_batched_tokens, max_num_seqs)",
        ),
        (
            ["pipeline=qwen3_tts", "+pipeline.stages.code2wav.scheduler.block_size=4"],
            "pipeline.stages.code2wav.scheduler has no key 'block_size'",
        ),
    ],
)
def test_a_key_in_the_wrong_place_says_where_it_is(overrides, hint):
    with pytest.raises(ConfigError) as exc:
        compose(["platform=cpu", *overrides])
    message = str(exc.value)
    assert hint in message and "\n" not in message, message
    assert "To append to your config" not in message and "discriminator" not in message
