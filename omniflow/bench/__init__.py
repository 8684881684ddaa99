"""Benchmarks: the load generator, metrics, sweep summaries, and engine-level baselines."""
