"""Models built or sized on torch's meta device (`models/meta.py`): no values are made, so
none of torch's reference ops runs, whose first use imports the compiler stack (about a
second of every `omniflow serve` and `synth` start on the CPU)."""

from __future__ import annotations

import subprocess
import sys

import torch

from omniflow.models.meta import materialize, on_meta

BUILD_AND_SIZE = """
import sys, torch
from omniflow.build.checks import parameter_counts
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.models.qwen3_tts.factory import build_talker
graph = build_graph(compose(["platform=cpu", "model=qwen3_tts_tiny_base"]))
counts = parameter_counts(graph.model)
assert counts["lm"] > 0 and counts["codec"] > 0 and counts["encoders"] > 0, counts
build_talker(graph.model, torch.device("cpu"))
print([m for m in ("torch._dynamo", "torch.fx.experimental.symbolic_shapes") if m in sys.modules])
"""


def test_building_and_sizing_a_model_runs_no_reference_op():
    done = subprocess.run(
        [sys.executable, "-c", BUILD_AND_SIZE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_on_meta_makes_parameters_without_values_or_init_calls():
    calls: list[str] = []

    class Probe(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 5)
            self.embed = torch.nn.Embedding(7, 2)
            calls.append("built")

    with on_meta():
        probe = Probe()
    assert calls == ["built"]
    assert all(p.is_meta for p in probe.parameters())
    assert sum(p.numel() for p in probe.parameters()) == 3 * 5 + 5 + 7 * 2
    # outside the context nothing is skipped: modules get torch's initialisation again
    assert torch.nn.Linear(3, 5).weight.abs().sum() > 0


def test_materialize_gives_each_parameter_memory_once_keeping_shared_ones_shared():
    with on_meta():
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        net[1].weight = net[0].weight  # tied
        net[1].alias = net[1].bias  # one parameter under two names of one module
        net[1].bias.requires_grad_(False)
    net = materialize(net.to(dtype=torch.bfloat16), torch.device("cpu"))
    params = dict(net.named_parameters(remove_duplicate=False))
    assert all(p.device.type == "cpu" and p.dtype == torch.bfloat16 for p in params.values())
    assert params["0.weight"] is params["1.weight"]
    assert net[1].alias is net[1].bias and not net[1].alias.is_meta
    assert len(list(net.parameters())) == 3
    assert not params["1.bias"].requires_grad and params["0.bias"].requires_grad
