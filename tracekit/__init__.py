"""tracekit: trace capture and replay analyzer for multi-GPU LLM inference."""

from tracekit._errors import CaptureError, InputError, OutputError, TracekitError, UsageError
from tracekit._memory import configure_env

__version__ = "0.1.0"
__all__ = ["__version__", "TracekitError", "InputError", "OutputError", "CaptureError", "UsageError", "configure_env"]
