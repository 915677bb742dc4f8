"""Helpers shared by commands: error mapping and output-format choice."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

import typer

from tracekit._errors import TracekitError

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["handle_errors", "at_least", "interrupt_reported"]

_REPORTED = [False]


def interrupt_reported() -> bool:
    """Whether a command already printed ``tracekit: interrupted`` in this process (then the CLI prints nothing more)."""
    return _REPORTED[0]


def at_least(option: str, value: int | None, lo: int) -> None:
    """A count option below ``lo`` is a usage error (``--top -1``, ``--skip-steps -1``, ``-j 0``)."""
    if value is not None and value < lo:
        from tracekit._errors import UsageError

        raise UsageError(f"{option} {value}: must be at least {lo}")


def handle_errors(fn: F) -> F:
    """Turn TracekitError into a one-line message + exit code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from tracekit.schema import guard_inputs

        _REPORTED[0] = False

        try:
            with guard_inputs():  # no output of this command may replace a file it reads
                return fn(*args, **kwargs)
        except TracekitError as e:
            print(f"tracekit: error: {e}", file=sys.stderr)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            print("tracekit: interrupted", file=sys.stderr)
            _REPORTED[0] = True
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]
