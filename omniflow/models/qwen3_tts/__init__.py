"""Qwen3-TTS (12 Hz): talker, code predictor, codec decoder, prompt layout, loader."""
