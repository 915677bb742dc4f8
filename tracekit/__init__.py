"""tracekit: trace capture and replay analyzer for multi-GPU LLM inference."""

__version__ = "0.1.0"
__all__ = ["__version__"]
