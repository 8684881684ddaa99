"""Gate 3 of multi-step windows: the runner re-checks a window plan against the requests it
holds, and says what single step a refused plan runs instead (docs/architecture.md,
"Multi-step decode windows"). The scheduler's gate (`sched/window.py`) decides from its own
view; this one guards the runner's state against a plan that disagrees with it, so that a
mismatch costs one exact step instead of K/V written at the wrong positions."""

from __future__ import annotations

from collections.abc import Mapping

from omniflow.core.step import StepPlan
from omniflow.worker.inputs import RunnerRequest


def window_refusal(plan: StepPlan, requests: Mapping[str, RunnerRequest]) -> str | None:
    """Why the runner cannot run `plan`'s window, or None. Every row must be decoding and
    compute one token in the window's first step, so that it samples at every step."""
    if set(plan.num_scheduled_tokens) != set(plan.window):
        return "partial_window"
    for rid, k in plan.window.items():
        r = requests.get(rid)
        if r is None:
            return "unknown_request"
        if k < 1 or plan.num_scheduled_tokens[rid] != k:
            return "plan_mismatch"
        if not r.in_decode:
            return "not_in_decode"
    return None


def refused_step(
    plan: StepPlan, requests: Mapping[str, RunnerRequest]
) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """The single step a refused window runs: (each row's tokens, in plan order; an error
    for each row it cannot run). A row in decode computes one token; a row outside the
    window its planned tokens. A window row still in its prompt gets an error instead: the
    scheduler reconciles a window as if every row sampled in its first step, and would
    otherwise fall out of step with the runner. The scheduler's own gate never plans one."""
    order: list[tuple[str, int]] = []
    errors: dict[str, str] = {}
    for rid in plan.num_scheduled_tokens:
        r = requests.get(rid)
        if r is None:
            errors[rid] = f"{rid}: not held by the runner"
        elif r.in_decode:
            order.append((rid, 1))
        elif rid not in plan.window:  # a partial window: this row's single step as planned
            order.append((rid, plan.num_scheduled_tokens[rid]))
        else:
            errors[rid] = f"{rid}: a window row must be decoding; this one is in its prompt"
    return order, errors
