"""tracekit: trace capture and replay analyzer for multi-GPU LLM inference."""

from tracekit._memory import configure_env as _configure_env

_configure_env()

from tracekit._errors import CaptureError, InputError, OutputError, TracekitError, UsageError  # noqa: E402 - after the allocator setup

__version__ = "0.1.0"
__all__ = ["__version__", "TracekitError", "InputError", "OutputError", "CaptureError", "UsageError"]
