"""benchmarks.thread_share: per-thread GIL samples from py-spy's raw stacks."""

from __future__ import annotations

from benchmarks.thread_share import summary, thread_samples

RAW = """\
thread (3789): talker-runner_0;Thread.run (threading.py:982);execute (ar_runner.py:151) 30
thread (3790): talker-runner_1;Thread.run (threading.py:982) 10
thread (3746): MainThread;<module> (t.py:5);spin (t.py:4) 47
thread (3746): MainThread 3
thread (3801);_find_and_load (<frozen importlib._bootstrap>:1176) 5
not a stack line
"""


def test_samples_are_summed_per_thread_name_with_pool_workers_joined():
    counts = thread_samples(RAW)
    assert counts == {"talker-runner": 40, "MainThread": 50, "thread 3801": 5}


def test_the_summary_gives_seconds_and_shares_of_the_wall_time():
    s = summary(thread_samples(RAW), rate=10, duration_s=10)
    assert s["samples"] == 95 and s["gil_busy_share"] == 0.95
    assert s["threads"]["MainThread"] == {"samples": 50, "seconds": 5.0, "wall_share": 0.5}
    assert list(s["threads"]) == ["MainThread", "talker-runner", "thread 3801"]
