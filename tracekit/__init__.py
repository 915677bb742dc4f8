"""tracekit: trace capture and replay analyzer for multi-GPU LLM inference."""

from tracekit._memory import configure_env as _configure_env

_configure_env()

__version__ = "0.1.0"
__all__ = ["__version__"]
