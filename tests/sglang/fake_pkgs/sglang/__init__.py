"""Fake ``sglang`` package for tracekit's tests (not SGLang; mirrors only the names tracekit uses)."""

__version__ = "0.5.23+fake"
