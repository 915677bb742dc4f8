"""One small exception hierarchy.

Every message names the file, rank, field or collective concerned and says
what to do about it; the CLI prints it as one line and exits non-zero.
Recoverable problems are not exceptions: they become quality flags
(:class:`Quality`) carried in results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["TracekitError", "InputError", "OutputError", "CaptureError", "UsageError", "ClusterError", "RankError", "MissingDependency",
           "require", "Quality", "QualityLog", "os_reason", "one_line"]


class TracekitError(Exception):
    """Base class; ``str(e)`` is the one-line user message."""

    exit_code = 1


class InputError(TracekitError):
    """A trace or input file is missing, unreadable or not what it claims to be."""

    exit_code = 2


class OutputError(TracekitError):
    """An output cannot be written (exists without --force, directory missing, disk full)."""

    exit_code = 3


class CaptureError(TracekitError):
    """Capture could not start or talk to its target."""

    exit_code = 4


class UsageError(TracekitError):
    """Options that contradict each other or name things that do not exist."""

    exit_code = 64


class ClusterError(TracekitError):
    """The cluster (``--cluster``) cannot be reached, has no workers, or lost a task's worker for good."""

    exit_code = 5


class RankError(InputError):
    """One rank's data cannot be read or its task failed; ``rank`` names it (``--keep-going`` leaves that rank out
    and analyzes the others). ``exit_code``: 2, or that of the error behind it (5: its cluster worker kept dying)."""

    def __init__(self, message: str, rank: int, exit_code: int = 2) -> None:
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code


class MissingDependency(UsageError):
    """An optional dependency is not installed; the message names the extra that provides it."""


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """``import module``; when its top package is not installed, :class:`MissingDependency`:
    ``<purpose> needs <package>, which is not installed: pip install 'tracekit[<extra>]'``. Any other
    import error (a bug inside the package) propagates unchanged."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module.split(".")[0]:  # the package is there, something inside it is not: a bug
            raise
        raise MissingDependency(f"{purpose} needs {e.name}, which is not installed: pip install 'tracekit[{extra}]'") from None


def one_line(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``...): a message that names a path holding a newline
    or a terminal escape stays one line and cannot drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def os_reason(e: OSError, *, writing: bool) -> str:
    """``(<strerror>); <remedy>`` for an OS error on a path: the remedy fits the errno.

    Disk full asks for space, a permission error for permissions, a directory
    for a file name; anything else for another path.
    """
    import errno

    why = e.strerror or type(e).__name__
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free disk space or choose another -o"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "check the permissions or choose another -o" if writing else "check the file's permissions"
    elif e.errno == errno.EISDIR:
        fix = "name a file, not a directory" + (" for -o" if writing else "")
    elif e.errno == errno.ELOOP:
        fix = "a symbolic link loops; fix or remove it"
    else:
        fix = "choose another -o" if writing else "check the path"
    return f"({why}); {fix}"


@dataclass(frozen=True)
class Quality:
    """A data-quality flag: ``code`` is stable (for --json), ``message`` is for people."""

    code: str
    message: str
    severity: str = "warning"  # "info" | "warning"
    rank: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"code": self.code, "message": self.message, "severity": self.severity}
        if self.rank is not None:
            d["rank"] = self.rank
        if self.details:
            d["details"] = self.details
        return d


class QualityLog(list):  # type: ignore[type-arg]
    """A list of :class:`Quality` with a convenience ``add``."""

    def add(self, code: str, message: str, *, severity: str = "warning", rank: int | None = None, **details: Any) -> None:
        self.append(Quality(code, message, severity, rank, dict(details)))
