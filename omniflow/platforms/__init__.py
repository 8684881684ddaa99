"""Platforms: device facts (dtype default, graph capture, window executor)."""
