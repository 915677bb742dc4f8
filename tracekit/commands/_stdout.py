"""stdout as a command's output: a failed write is a user error, not an internal one.

Contract: :func:`guarded` wraps ``sys.stdout`` for the duration of a command. A write or flush that fails
(EPIPE: the reader of a pipe exited; ENOSPC/EDQUOT: ``> /dev/full``, a full disk; EBADF or no stdout at
all: started with ``>&-``; EIO) raises :class:`OutputError` with one line naming stdout, the reason and
what to do, plus every file the command already published (``tracekit.schema.published_outputs``: those
are complete and kept). The failed descriptor is then pointed at ``/dev/null``, so the interpreter's own
flush at exit cannot print a second error. The command flushes stdout before it returns
(:func:`flush`), so a buffered write fails inside the command, with its exit code, never at exit.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, Iterable

from tracekit._errors import OutputError

__all__ = ["StdoutGuard", "guarded", "flush", "settle", "reserve_closed_stdout"]


def _remedy(e: OSError | None) -> str:
    if e is None or e.errno == errno.EBADF:
        return "stdout is closed; redirect it to a file (e.g. > report.txt)"
    if e.errno == errno.EPIPE:
        return (f"stdout: cannot write ({e.strerror}); the program reading the output exited before the end "
                "(e.g. `| head`); the output is incomplete")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"stdout: cannot write ({e.strerror}); free disk space or redirect the output elsewhere"
    return f"stdout: cannot write ({e.strerror or type(e).__name__}); redirect the output elsewhere"


def _published() -> str:
    from tracekit.schema import published_outputs

    done = [str(p) for p in published_outputs()]
    if not done:
        return ""
    return f"; {', '.join(done)} {'was' if len(done) == 1 else 'were'} written and kept (complete)"


class StdoutGuard:
    """A text stream in front of the real stdout (``None`` when there is none); see the module docstring.

    After a failure every write and flush raises the same :class:`OutputError` (a caller that swallows one,
    as click's stream probing does, cannot turn the loss silent) until :func:`settle` says it was reported."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._error: OutputError | None = None
        self._reported = False

    def _fail(self, e: OSError | None) -> OutputError:
        if self._error is None:
            self._error = OutputError(_remedy(e) + _published())
            try:
                fd = self._stream.fileno() if self._stream is not None else None
            except (OSError, ValueError, AttributeError):
                fd = None
            if fd is not None:  # the interpreter flushes stdout at exit: make that write go nowhere, silently
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)
        return self._error

    def _check(self) -> bool:
        """True when writing should go on; raises the recorded error while it is unreported."""
        if self._error is None:
            return True
        if self._reported:
            return False
        raise self._error

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # a text stream (click probes with b"" to tell text from binary)
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not text:
            return 0
        if not self._check():
            return len(text)
        if self._stream is None:
            raise self._fail(None)
        try:
            return int(self._stream.write(text))
        except OSError as e:
            raise self._fail(e) from None

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self._check() or self._stream is None:
            return
        try:
            self._stream.flush()
        except OSError as e:
            raise self._fail(e) from None

    def settle(self) -> None:
        """The failure was reported: later writes (the interpreter's flush at exit) are dropped."""
        self._reported = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def settle() -> None:
    """Mark a stdout failure as reported (the one-line error was printed)."""
    if isinstance(sys.stdout, StdoutGuard):
        sys.stdout.settle()


class guarded:
    """Context manager: ``sys.stdout`` is a :class:`StdoutGuard` inside (nested uses keep the outer one)."""

    def __enter__(self) -> StdoutGuard:
        self._prev = sys.stdout
        if not isinstance(sys.stdout, StdoutGuard):
            sys.stdout = StdoutGuard(sys.stdout)
        return sys.stdout

    def __exit__(self, *exc: object) -> None:
        sys.stdout = self._prev


def flush() -> None:
    """Flush stdout now (inside the command): a failure raises :class:`OutputError` here, not at exit."""
    if sys.stdout is not None:
        sys.stdout.flush()


def reserve_closed_stdout() -> None:
    """If the process started with file descriptor 1 closed (``>&-``), hold it open on ``/dev/null`` so no file
    the command opens gets descriptor 1; ``sys.stdout`` stays None, so a write still fails (:class:`StdoutGuard`)."""
    try:
        os.fstat(1)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
