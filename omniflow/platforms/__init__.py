"""Platforms: device facts (dtype default, graph capture, batched decode attention)."""
