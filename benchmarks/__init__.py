"""Profilers and one-off drivers, outside the `omniflow` package: benchmarks/README.md."""
