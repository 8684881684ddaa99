"""Seeded arrivals (omniflow/bench/arrivals.py): the same seed makes the same run, and
Poisson arrivals look Poisson (exponential gaps: mean 1/rate, as spread as their mean)."""

from __future__ import annotations

import statistics

import pytest

from omniflow.bench.arrivals import arrival_times


def test_a_seed_makes_the_same_arrivals_and_another_seed_others():
    a = arrival_times(10.0, 30.0, "poisson", seed=7)
    assert a == arrival_times(10.0, 30.0, "poisson", seed=7)
    assert a != arrival_times(10.0, 30.0, "poisson", seed=8)
    assert a == sorted(a) and a[0] > 0 and a[-1] < 30.0
    # twice the rate, the same seed: the same arrivals at half the times (a sweep over rates
    # sees one pattern of bursts on two time scales)
    b = arrival_times(20.0, 15.0, "poisson", seed=7)
    assert len(b) == len(a) and b == pytest.approx([t / 2 for t in a])


def test_poisson_arrivals_have_exponential_gaps_at_the_rate():
    rate, until = 10.0, 2000.0
    times = arrival_times(rate, until, "poisson", seed=0)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    mean = statistics.fmean(gaps)
    # ~20,000 gaps: the mean's standard error is ~0.7 % of it; 2 % is 3 of them
    assert mean == pytest.approx(1 / rate, rel=0.02)
    assert len(times) == pytest.approx(rate * until, rel=0.02)
    # an exponential's spread equals its mean (constant gaps would have none)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.05)
    # memoryless: as many arrivals in the first half as in the second
    first = sum(1 for t in times if t < until / 2)
    assert first / len(times) == pytest.approx(0.5, abs=0.02)


def test_constant_arrivals_come_every_one_over_the_rate_from_zero():
    assert arrival_times(2.0, 2.0, "constant") == [0.0, 0.5, 1.0, 1.5]
    assert arrival_times(4.0, 0.6, "constant") == [0.0, 0.25, 0.5]
    assert arrival_times(2.0, 2.0, "constant", seed=3) == arrival_times(2.0, 2.0, "constant")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="positive"):
        arrival_times(0.0, 1.0)
    with pytest.raises(ValueError, match="unknown arrivals"):
        arrival_times(1.0, 1.0, "uniform")  # type: ignore[arg-type]
