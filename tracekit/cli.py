"""Thin typer CLI: each command lives in ``tracekit/commands/<name>.py``.

A command validates options, calls the library, hands the result to a
reporter and maps :class:`~tracekit._errors.TracekitError` to a one-line
message and a non-zero exit code (no traceback).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

import typer

from tracekit._errors import TracekitError

__all__ = ["app", "main"]

app = typer.Typer(
    name="tracekit",
    help="Trace capture and replay analyzer for multi-GPU LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_COMMANDS = ("convert", "analyze", "capture", "launch", "timeline", "export", "replay", "diff")

for _name in _COMMANDS:
    try:
        _mod = importlib.import_module(f"tracekit.commands.{_name}")
    except ModuleNotFoundError as _e:  # a command not built yet
        if _e.name != f"tracekit.commands.{_name}":
            raise
        continue
    _mod.register(app)


class _Terminated(BaseException):
    """Raised from the SIGTERM handler so ``finally``/atomic-write cleanup runs before exit."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated()


def main() -> None:
    """Console entry point."""
    try:
        prev = signal.signal(signal.SIGTERM, _on_sigterm)
        # Ctrl-C always stops a command (exit 130, outputs cleaned up), also when the shell started it with
        # SIGINT ignored (a background job of a script): the first Ctrl-C raises KeyboardInterrupt
        prev_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread (embedded use): keep the defaults
        prev = prev_int = None
    try:
        _run()
    finally:
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)
        if prev_int is not None:
            signal.signal(signal.SIGINT, prev_int)


def _run() -> None:
    try:
        app(standalone_mode=True)
    except _Terminated:
        print("tracekit: terminated", file=sys.stderr)
        sys.exit(143)
    except TracekitError as e:
        print(f"tracekit: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("tracekit: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - last resort: a bug must not print a traceback to users
        if os.environ.get("TRACEKIT_DEBUG"):
            raise
        msg = " ".join(f"{type(e).__name__}: {e}".split())[:500]
        print(f"tracekit: internal error: {msg}; please report it (TRACEKIT_DEBUG=1 shows the traceback)", file=sys.stderr)
        sys.exit(70)


if __name__ == "__main__":
    main()
