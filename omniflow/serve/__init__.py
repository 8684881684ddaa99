"""Serving: the OpenAI-compatible HTTP API and audio encoding."""
