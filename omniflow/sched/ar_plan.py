"""The AR scheduler's plan assembly: what the runner is told of each scheduled request, and
the placeholders that stand for the tokens the step will sample until update() sees them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from omniflow.core.request import Request
from omniflow.core.step import CachedRequestData, NewRequestData, StepPlan
from omniflow.sched.kv_cache import KVCacheManager
from omniflow.sched.runner_roster import RunnerRoster


@dataclass
class StepDraft:
    """The step being planned: each seated request's tokens, new KV blocks and computed
    count before the step, and the token budget left."""

    budget: int
    scheduled: dict[str, int] = field(default_factory=dict)
    new_blocks: dict[str, list[int]] = field(default_factory=dict)
    computed_before: dict[str, int] = field(default_factory=dict)

    def take(self, req: Request, n: int, blocks: list[int]) -> None:
        """Seat `req` for `n` tokens in `blocks` (allocated for them)."""
        self.scheduled[req.request_id] = n
        self.new_blocks[req.request_id] = blocks
        self.computed_before[req.request_id] = req.num_computed_tokens
        self.budget -= n


def assemble_plan(
    step_id: int,
    scheduled: dict[str, int],
    new_blocks: Mapping[str, list[int]],
    window: dict[str, int],
    requests: Mapping[str, Request],
    kv: KVCacheManager,
    roster: RunnerRoster,
) -> tuple[StepPlan, dict[str, int]]:
    """The plan, and the tokens each request will sample in it. A request new to the runner
    goes with its whole state, a known one with its new blocks; each one's computed count
    moves past the step, with a placeholder per token it samples."""
    new_reqs: list[NewRequestData] = []
    cached: list[CachedRequestData] = []
    expected: dict[str, int] = {}
    for rid, n in scheduled.items():
        req = requests[rid]
        if roster.knows(rid):
            cached.append(
                CachedRequestData(
                    rid,
                    tuple(new_blocks[rid]),
                    req.num_computed_tokens,
                    num_blocks=len(kv.block_ids(rid)),
                )
            )
        else:
            new_reqs.append(new_request_data(req, kv))
            roster.introduce(rid)
        req.num_computed_tokens += n
        if rid in window:
            req.num_placeholders += window[rid]
            expected[rid] = window[rid]
        elif req.num_computed_tokens == req.num_tokens:
            req.num_placeholders += 1
            expected[rid] = 1
    dropped, preempted = roster.take_drops()
    plan = StepPlan(
        step_id=step_id,
        num_scheduled_tokens=scheduled,
        new_requests=tuple(new_reqs),
        cached_requests=tuple(cached),
        finished_ids=dropped,
        preempted_ids=preempted,
        total_num_tokens=sum(scheduled.values()),
        window=window,
    )
    return plan, expected


def new_request_data(req: Request, kv: KVCacheManager) -> NewRequestData:
    """Everything the runner needs to take the request on (again, after a preemption)."""
    return NewRequestData(
        request_id=req.request_id,
        payload=req.payload,
        prompt_len=req.prompt_len,
        sampling=req.sampling,
        seed=req.seed,
        output_tokens=tuple(req.output_tokens),
        output_frames=tuple(req.output_frames),
        block_ids=kv.block_ids(req.request_id),
        num_computed_tokens=req.num_computed_tokens,
    )
