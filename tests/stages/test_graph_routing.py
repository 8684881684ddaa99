"""The graph is what runs: stage names come from the configuration, never from the code.

A pipeline defined only in a user's config directory, with its stages renamed, builds every
stage it declares and synthesises the same PCM as the shipped pipeline for the same seed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import CONF_DIR, compose
from omniflow.config.resolve import build_graph
from tests.factories import Collector, speech, tiny_bundle, wait_idle

REPO = Path(__file__).resolve().parents[2]
SHIPPED = (CONF_DIR / "pipeline/qwen3_tts.yaml").read_text()


def renamed(source: str, receiver: str) -> str:
    """The shipped two-stage pipeline with its stages renamed (YAML text edit)."""
    text = SHIPPED.replace("name: qwen3_tts", f"name: {source}_{receiver}")
    text = text.replace("  code2wav:", f"  {receiver}:")
    text = text.replace("  talker:", f"  {source}:").replace("stage: talker", f"stage: {source}")
    return text


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user_conf")
    (root / "pipeline").mkdir()
    (root / "pipeline/vocoder_pipe.yaml").write_text(renamed("talker", "vocoder"))
    (root / "pipeline/three_names.yaml").write_text(renamed("speaker", "vocoder"))
    return root


def synth(pipeline: str, config_dir: Path | None, rid: str) -> tuple[np.ndarray, tuple[str, ...]]:
    graph = build_graph(compose([f"pipeline={pipeline}", "platform=cpu"], config_dir))
    orch = build_pipeline(graph, tiny_bundle())
    orch.start()
    try:
        c = Collector()
        orch.submit(speech(rid, seed=11, max_new_tokens=30, ignore_eos=True), c)
        c.wait()
        assert c.terminal.error is None
        wait_idle(orch)
        return c.pcm, tuple(s.name for s in orch.stats().stages)
    finally:
        orch.stop()


@pytest.mark.parametrize(
    ("pipeline", "stages"),
    [("vocoder_pipe", ("talker", "vocoder")), ("three_names", ("speaker", "vocoder"))],
)
def test_a_renamed_user_pipeline_gives_the_shipped_pcm(config_dir, pipeline, stages):
    reference, shipped_stages = synth("qwen3_tts", None, "ref")
    assert shipped_stages == ("talker", "code2wav")
    pcm, built = synth(pipeline, config_dir, "renamed")
    assert built == stages  # every declared stage is built, under its own name
    assert pcm.shape == reference.shape == (30 * 1920,)
    assert np.array_equal(pcm, reference)


def test_config_prints_the_renamed_graph(config_dir):
    r = subprocess.run(
        [sys.executable, "-m", "omniflow", "config", "--config-dir", str(config_dir)]
        + ["pipeline=three_names", "platform=cpu"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert "final_stage: vocoder" in r.stdout
    assert "downstream: vocoder" in r.stdout


LAYERS = ("engine", "worker", "sched", "sampling", "device", "build", "serve", "bench")


def test_no_stage_name_literal_in_the_generic_layers():
    """Stage names live in configuration; the engine, server and benchmarks route by graph."""
    assert all((REPO / "omniflow" / layer).is_dir() for layer in LAYERS)
    pattern = re.compile(r"""["'](talker|code2wav)["']""")
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for layer in LAYERS
        for path in sorted((REPO / "omniflow" / layer).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_a_held_notice_travels_to_the_downstream_stage_only():
    """A preempted request's `held` notice becomes a `Hold` message for the stage it feeds
    (whose receive deadline then waits) and reaches no sink."""
    from omniflow.core.output import StageOutput
    from omniflow.engine.messages import Hold

    graph = build_graph(compose(["pipeline=qwen3_tts", "platform=cpu"]))
    orch = build_pipeline(graph, tiny_bundle())
    talker, receiver = orch.engines
    sent = []
    receiver.send = sent.append  # record what the orchestrator routes to the receiver
    routed = []
    orch.router.post = routed.append  # capture what the engines post
    talker.on_output(StageOutput("r", held=True))
    receiver.on_output(StageOutput("r", held=True))  # the final stage feeds nobody
    for message in routed:
        orch.router.apply(message)  # what the router's thread does, inline
    assert sent == [Hold("r")]
