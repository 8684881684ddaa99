"""Multi-step merged decode windows: plan-time gate, K clamping, KV for the extra steps,
and the counters (docs/architecture.md: multi-step windows).

A window merges up to K decode steps of every scheduled request into one scheduling round;
the runner replays them inside one execute, feeding each sampled token into the next. Every
row decodes: a step that admits new requests stays a single step, so their first audio comes
after one step, not a window (an arrival also ends a running window, `core/arrivals.py`). It is
real sampling, so a window's tokens equal the single-step tokens whenever the batch
composition is the same step by step. Every refusal falls back to the exact single step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from omniflow.core.pipeline import WindowCounters
from omniflow.core.request import Request
from omniflow.core.step import StepResult
from omniflow.sched.kv_cache import KVCacheManager


@dataclass
class WindowStats:
    """Cumulative counters (logged per interval, exported on /metrics)."""

    planned_windows: int = 0
    executed_windows: int = 0
    executed_steps: int = 0
    refusals: Counter[str] = field(default_factory=Counter)
    sizes: Counter[int] = field(default_factory=Counter)
    """Planned windows by length (the longest request's steps)."""
    cut_windows: int = 0
    """Windows an arrival ended before their planned length."""
    arrival_steps: int = 0
    """Steps the running streams sat out so that arrivals were prefilled alone
    (`seating.arrivals_alone`)."""

    def record(self, result: StepResult) -> None:
        """A windowed plan's result: the steps it ran, as a window or refused or cut."""
        self.executed_steps += result.window_steps
        if result.window_steps > 1:
            self.executed_windows += 1
        if result.window_refusal is not None:
            self.refusals[result.window_refusal] += 1
        self.cut_windows += result.window_cut

    def counters(self, audio_cycles: int = 0) -> WindowCounters:
        """The typed snapshot for the stage's gauges (`/metrics`, the INFO line), with the
        scheduler's held-frame cycles (`sched/audio_cycle.py`)."""
        done = (self.planned_windows, self.executed_windows, self.executed_steps)
        sizes = dict(self.sizes)
        return WindowCounters(
            *done, dict(self.refusals), sizes, self.cut_windows, self.arrival_steps, audio_cycles
        )


@dataclass(frozen=True)
class Candidate:
    """A request scheduled this step, as the window gate sees it."""

    request: Request
    num_tokens: int
    """Tokens the single-step plan gives it."""
    computed_before: int
    """Its computed count before this step was planned."""
    is_new: bool
    """New to the runner in this plan (admitted or resumed)."""


def plan_window(
    k: int,
    candidates: list[Candidate],
    waiting: int,
    budget: int,
    max_model_len: int,
    kv: KVCacheManager,
    stats: WindowStats,
    slack_k: int | None = None,
) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Gate 2: open a window only when it is exact and safe. Returns ({request: k_r, the
    frames it samples}, {request: extra block ids}); ({}, {}) means single step (the refusal
    is counted). A decoding request computes k_r tokens. `slack_k`: the most steps the
    streams' playback slack allows (`sched/playback.py`); a window it would cut below 2
    steps is refused as `slack`."""
    if k < 2 or not candidates:
        return {}, {}
    reason = _refusal(candidates, waiting)
    if reason is not None:
        stats.refusals[reason] += 1
        return {}, {}
    sizes: dict[str, int] = {}
    for c in candidates:
        r = c.request
        sizes[r.request_id] = min(
            k,
            r.sampling.max_new_tokens - r.num_generated,
            max_model_len - r.num_tokens,
        )
    # A live request's text has arrived only so far, and every row's text is loaded for the
    # whole window (`DecodeBatch.load`): the window stops where the shortest text does.
    text = min((room for c in candidates if (room := c.request.input_room) is not None), default=k)
    if text < 2:
        stats.refusals["text"] += 1
        return {}, {}
    sizes = {rid: min(n, text) for rid, n in sizes.items()}
    if max(sizes.values()) < 2:
        stats.refusals["clamped"] += 1
        return {}, {}
    if slack_k is not None:
        if slack_k < 2:
            stats.refusals["slack"] += 1
            return {}, {}
        sizes = {rid: min(n, slack_k) for rid, n in sizes.items()}
    if sum(c.num_tokens + sizes[c.request.request_id] - 1 for c in candidates) > budget:
        stats.refusals["budget"] += 1
        return {}, {}
    extra: dict[str, list[int]] = {}
    for c in candidates:
        rid = c.request.request_id
        blocks = kv.allocate_slots(rid, c.computed_before + c.num_tokens + sizes[rid] - 1)
        if blocks is None:
            # Out of KV: undo the window's extra blocks; the single step keeps its own.
            for done in candidates:
                kv.trim(done.request.request_id, done.computed_before + done.num_tokens)
            stats.refusals["kv"] += 1
            return {}, {}
        extra[rid] = blocks
    stats.planned_windows += 1
    stats.sizes[max(sizes.values())] += 1
    return sizes, extra


def prefills(c: Candidate) -> bool:
    """Its step computes context rather than one decode token: a request new to the runner,
    or one still in its prompt (judged on the computed count *before* this step, so its last
    prefill token counts), or more than one token."""
    return c.is_new or c.computed_before < c.request.prompt_len or c.num_tokens != 1


def _refusal(candidates: list[Candidate], waiting: int) -> str | None:
    """Why the step stays a single step, or None: a request waits to be seated, or a row
    does not decode its next token (a new request, a prompt, a preempted recompute)."""
    if waiting:
        return "waiting"
    for c in candidates:
        if prefills(c):
            return "new_request" if c.is_new else "prefill"
        if c.computed_before + 1 != c.request.num_tokens:
            return "not_at_end"
    return None


def reconcile_window(req: Request, k: int, tokens: tuple[int, ...], kv: KVCacheManager) -> None:
    """The runner produced fewer than k tokens (EOS inside the window, a refusal): roll the
    computed count back to what was really written and free the unused slots."""
    short = k - len(tokens)
    if short > 0:
        req.num_computed_tokens -= short
        kv.trim(req.request_id, req.num_computed_tokens)
