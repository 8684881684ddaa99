"""A window the runner refuses at run time (gate 3) falls back to the exact single step:
the scheduler trims the window's unused blocks, and the runner's own block table must follow,
or later K/V lands in blocks the pool has since handed to another request. With a small,
recycling pool and windows that cross block boundaries, every request's codes must equal the
window_k=0 run."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.core.step import StepPlan
from omniflow.engine.stage_engine import StageEngine
from omniflow.models.qwen3_tts.ar_model import build_ar_model
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.sched.ar import ARScheduler
from omniflow.worker.ar_runner import ARModelRunner
from tests.factories import speech, tiny_bundle
from tests.stages.test_talker_engine import collect

REASONS = ("partial_window", "unknown_request", "plan_mismatch", "not_in_decode")


class RefusingRunner(ARModelRunner):
    """Refuses the windows it is told to, as the run-time gate would on a mismatch."""

    def __init__(self, *args, refuse, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.refuse = refuse
        self.refused = 0
        self.kv = None
        """The scheduler's KV manager: in sync scheduling the runner's block tables must
        equal its tables whenever a plan is applied."""
        self.checked = 0

    def _apply_plan_state(self, plan: StepPlan) -> None:
        super()._apply_plan_state(plan)
        if self.kv is None:
            return
        for rid, r in self.requests.items():
            assert tuple(r.block_ids) == self.kv.block_ids(rid), rid
            self.checked += 1

    def _window_refusal(self, plan: StepPlan) -> str | None:
        reason = next(self.refuse)
        if reason is not None:
            self.refused += 1
            return reason
        return super()._window_refusal(plan)


def run(window_k: int, refuse, async_scheduling: bool = False):
    cfg = SchedulerConfig(
        max_num_seqs=4,
        max_num_batched_tokens=256,
        max_model_len=64,
        block_size=4,
        num_kv_blocks=40,  # 4 requests of up to ~50 tokens: blocks are reused constantly
        async_scheduling=async_scheduling,
    )
    bundle = tiny_bundle()
    runner = RefusingRunner(
        build_ar_model(bundle), cfg, torch.device("cpu"), torch.float32, refuse=refuse
    )
    scheduler = ARScheduler(cfg, window_k=window_k)
    if not async_scheduling:  # async: the scheduler's tables run a step ahead
        runner.kv = scheduler.kv
    engine = StageEngine("talker", scheduler, runner, async_scheduling=async_scheduling)
    proc = TalkerProcessor(bundle.tokenizer, bundle.vocab, cfg.max_model_len)
    texts = ["Hi.", "Hello there.", "A bit longer now.", "Short."]
    for i, text in enumerate(texts):
        req = speech(f"r{i}", text=text, seed=10 + i, max_new_tokens=14 + 3 * i, ignore_eos=True)
        assert engine.add_request(proc.make_request(req)) == []
    frames = collect(engine.run_until_idle())
    return frames, runner, engine


@functools.cache
def k0_reference(async_scheduling: bool):
    """The window_k=0 codes (the same for every refusal reason: computed once per mode)."""
    return run(0, itertools.repeat(None), async_scheduling)[0]


@pytest.mark.parametrize("reason", REASONS)
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_refused_windows_give_the_k0_codes_with_a_recycling_pool(reason, async_scheduling):
    reference = k0_reference(async_scheduling)
    # refuse every other window (the others run: refusals interleave with real windows)
    frames, runner, engine = run(
        4, itertools.cycle([reason, None]), async_scheduling=async_scheduling
    )
    assert runner.refused > 0
    assert async_scheduling or runner.checked > 0
    stats = engine.stats().windows
    assert stats.refusals.get(reason, 0) == runner.refused and stats.executed > 0
    assert frames == reference
    assert engine.stats().kv_blocks_used == 0
