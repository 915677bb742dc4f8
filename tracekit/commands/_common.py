"""Helpers shared by commands: error mapping and output-format choice."""

from __future__ import annotations

import functools
from dataclasses import dataclass
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import typer

from tracekit._errors import TracekitError, one_line
from tracekit.commands import _stdout

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["handle_errors", "at_least", "interrupt_reported", "stopped_early", "say", "warn_read_flags", "parquet_output"]

@dataclass
class _Reported:
    """Whether the running command printed ``tracekit: interrupted`` (or kept a capture's output) itself."""

    interrupt: bool = False


_REPORTED = _Reported()


def interrupt_reported() -> bool:
    """Whether a command already printed ``tracekit: interrupted`` in this process (then the CLI prints nothing more)."""
    return _REPORTED.interrupt


def say(line: str) -> None:
    """One line on stderr, control characters escaped (a file name with a newline stays one line); a stderr that
    cannot be written is ignored (the exit code still tells)."""
    try:
        print(one_line(line), file=sys.stderr)
    except (OSError, ValueError):
        pass


def warn_read_flags(meta: Any) -> None:
    """The repairs validation made while reading a trace (``tracekit.trace_check``), as warnings on stderr, for
    the commands whose output has no data-quality section of its own (timeline, export, replay, diff)."""
    from tracekit.trace_check import READ_FLAGS

    for q in (meta or {}).get("quality") or []:
        if isinstance(q, dict) and q.get("code") in READ_FLAGS:
            say(f"tracekit: warning: {q.get('message')}")


#: output names that promise another format than the trace.parquet convert and capture write
_NOT_PARQUET = (".json", ".json.gz", ".gz", ".html", ".htm", ".sqlite", ".csv", ".txt", ".nsys-rep", ".qdrep", ".pt")


def parquet_output(option: str, path: Path) -> None:
    """A trace.parquet output named like another format (``-o x.json``) is a usage error, not Parquet bytes under
    a name that says JSON."""
    name = path.name.lower()
    hit = next((sfx for sfx in _NOT_PARQUET if name.endswith(sfx)), None)
    if hit is not None:
        from tracekit._errors import UsageError

        hint = "; for Chrome/Perfetto JSON use `tracekit export --perfetto FILE.json`" if ".json" in hit else ""
        raise UsageError(f"{option} {path}: the output is a trace.parquet, not {hit}; name it e.g. "
                         f"{path.with_name(path.name[: -len(hit)] + '.parquet')}{hint}")


def at_least(option: str, value: int | None, lo: int) -> None:
    """A count option below ``lo`` is a usage error (``--top -1``, ``--skip-steps -1``, ``-j 0``)."""
    if value is not None and value < lo:
        from tracekit._errors import UsageError

        raise UsageError(f"{option} {value}: must be at least {lo}")


def stopped_early(stopped_by: str | None, out: object) -> None:
    """A capture stopped by Ctrl-C kept what it collected: one line naming where, exit 130 (SIGTERM: 143).

    The command is interrupted (the exit code says so), but what was collected is written and flagged
    ``capture_interrupted``, so scripts see both."""
    if stopped_by == "Ctrl-C":
        print(f"tracekit: interrupted; kept what was collected in {out} (flagged capture_interrupted)", file=sys.stderr)
        _REPORTED.interrupt = True
        raise typer.Exit(130)
    if stopped_by == "SIGTERM":
        print(f"tracekit: terminated; kept what was collected in {out} (flagged capture_interrupted)", file=sys.stderr)
        raise typer.Exit(143)


def handle_errors(fn: F) -> F:
    """Turn TracekitError into a one-line message + exit code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from tracekit._inputs import guard_inputs

        from tracekit import _interrupt

        _REPORTED.interrupt = False

        try:
            # a Ctrl-C stops the command (also one that came while the options were parsed) until its output is published
            with _interrupt.command(), guard_inputs(), _stdout.guarded():  # no output may replace a file it reads
                rv = fn(*args, **kwargs)
                _stdout.flush()  # a buffered report that cannot be written fails here, with its exit code
                return rv
        except TracekitError as e:
            say(f"tracekit: error: {e}")
            _stdout.settle()
            raise typer.Exit(e.exit_code) from None
        except BaseException as e:
            # KeyboardInterrupt from _interrupt.check(), or (last resort) polars' PanicException when a second
            # Ctrl-C landed in one of its Python callbacks
            if not _interrupt.is_interrupt(e):
                raise
            print("tracekit: interrupted", file=sys.stderr)
            _REPORTED.interrupt = True
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]
