"""Schedulers and the KV-cache block manager (imports core/ only)."""
