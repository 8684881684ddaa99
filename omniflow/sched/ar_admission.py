"""How windows and admissions trade off in the AR scheduler (`sched/window.py` plans the
window itself): which waiting requests keep a window from opening, and when waiting ones are
held back so they can join a window instead of being prefilled alone."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from omniflow.core.request import Request


def admissible_waiting(
    waiting: Iterable[Request],
    paused: Collection[str],
    num_running: int,
    max_num_seqs: int,
    window_admits: bool,
) -> int:
    """Waiting requests that keep a window from opening (it would delay their admission by its
    k steps); paused ones never count. With `window_admits` none counts while every seat is
    taken: none could enter before a running one ends, so refusing the window would only
    single-step the running rows; they are admitted at the window's end instead."""
    if window_admits and num_running >= max_num_seqs:
        return 0
    return sum(1 for r in waiting if r.request_id not in paused)


def hold_for_window(
    running: Iterable[Request],
    paused: Collection[str],
    outstanding: Mapping[str, int],
    window_admits: bool,
) -> bool:
    """With `window_admits`: while every running request (paused ones aside) has a window in
    flight, waiting ones are not admitted alone but into a window beside the running rows
    after its update. Under async scheduling the next step is planned while a window runs, so
    an arrival would otherwise always be prefilled in a step of its own and never join one."""
    if not window_admits:
        return False
    unpaused = [r for r in running if r.request_id not in paused]
    return bool(unpaused) and all(r.request_id in outstanding for r in unpaused)
