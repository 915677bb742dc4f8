"""Fake sglang.srt."""
