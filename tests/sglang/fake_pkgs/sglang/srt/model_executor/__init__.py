"""Fake sglang.srt.model_executor."""
