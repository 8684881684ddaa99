"""GPU checks of the talker engine (run on the GPU machine: pytest -m cuda)."""

from __future__ import annotations

import pytest
import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.engine.stage_engine import StageEngine
from omniflow.models.qwen3_tts.ar_model import build_ar_model
from omniflow.models.qwen3_tts.factory import build_talker
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.sched.ar import ARScheduler
from omniflow.worker.ar_runner import ARModelRunner
from tests.factories import speech, tiny_model_config

pytestmark = pytest.mark.cuda


def run(async_scheduling: bool, dtype: str) -> dict[str, list]:
    cfg = tiny_model_config().model_copy(update={"dtype": dtype})
    dev = torch.device("cuda")
    bundle = build_talker(cfg, dev)
    sc = SchedulerConfig(
        max_model_len=256, block_size=16, num_kv_blocks=128, async_scheduling=async_scheduling
    )
    runner = ARModelRunner(
        build_ar_model(bundle), sc, dev, bundle.talker.weights.talker.codec_head.weight.dtype
    )
    engine = StageEngine("talker", ARScheduler(sc), runner, async_scheduling=async_scheduling)
    proc = TalkerProcessor(bundle.tokenizer, bundle.vocab, 256)
    for i in range(4):
        engine.add_request(
            proc.make_request(speech(f"r{i}", seed=i, max_new_tokens=12 + i, ignore_eos=True))
        )
    frames: dict[str, list] = {}
    for o in engine.run_until_idle():
        frames.setdefault(o.request_id, []).extend(o.frames)
    return frames


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_engine_runs_and_sync_equals_async(dtype):
    sync = run(False, dtype)
    assert {k: len(v) for k, v in sync.items()} == {f"r{i}": 12 + i for i in range(4)}
    assert all(len(f) == 16 for v in sync.values() for f in v)
    assert run(True, dtype) == sync


def test_cuda_windows_give_the_single_step_codes():
    import torch as _torch

    from omniflow.engine.stage_engine import StageEngine as _Engine

    def frames(window_k: int) -> dict[str, list]:
        cfg = tiny_model_config().model_copy(update={"dtype": "bfloat16"})
        dev = _torch.device("cuda")
        bundle = build_talker(cfg, dev)
        sc = SchedulerConfig(max_model_len=256, block_size=16, num_kv_blocks=128)
        runner = ARModelRunner(build_ar_model(bundle), sc, dev, _torch.bfloat16)
        engine = _Engine("talker", ARScheduler(sc, window_k=window_k), runner)
        proc = TalkerProcessor(bundle.tokenizer, bundle.vocab, 256)
        for i in range(3):
            engine.add_request(
                proc.make_request(speech(f"r{i}", seed=i, max_new_tokens=20, ignore_eos=True))
            )
        out: dict[str, list] = {}
        for o in engine.run_until_idle():
            out.setdefault(o.request_id, []).extend(o.frames)
        return out

    assert frames(8) == frames(0)
