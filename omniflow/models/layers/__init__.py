"""Building blocks shared by the model families (Qwen3 decoder parts)."""
