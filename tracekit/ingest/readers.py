"""Registry of input formats (Perfetto's resolver registry is the pattern): one entry per reader module.

A reader module (``tracekit/ingest/<format>.py``) declares ``READER = Reader(...)``: its format name,
how to recognise a path (``detect``), how to read one source (``read``: raw rows + metadata, one
rank or several) and, for sources that hold several ranks, how to split them (``split``).
:func:`readers` finds every such module in this package, so adding a format (rocprof, vLLM, ...) is
one new module; discovery (:mod:`tracekit.ingest.discover`) and convert ask the registry, never a
format name. A reader with an optional dependency imports it inside ``read`` with
:func:`tracekit._errors.require`, so its module always imports and a missing package is a one-line
error naming the extra to install.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import polars as pl

from tracekit._errors import InputError

__all__ = ["Reader", "readers", "reader_for", "get_reader"]

RawRank = tuple[pl.DataFrame, dict[str, Any]]


@dataclass(frozen=True)
class Reader:
    """One input format. ``detect(path)`` must be cheap (name/stat only); ``priority``: higher is asked first."""

    fmt: str
    detect: Callable[[Path], bool]
    read: Callable[[Path, int | None], RawRank]
    split: Callable[[pl.DataFrame, dict[str, Any]], list[RawRank]] | None = None
    priority: int = 0


@lru_cache(maxsize=1)
def readers() -> tuple[Reader, ...]:
    """Every ``READER`` declared by a module of ``tracekit.ingest`` (highest priority first)."""
    import tracekit.ingest as pkg

    found: list[Reader] = []
    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name.startswith("_") or m.name in ("readers", "discover", "convert", "common", "rankwrite"):
            continue
        mod = importlib.import_module(f"tracekit.ingest.{m.name}")  # an import error is a bug: it is not hidden
        r = getattr(mod, "READER", None)
        if isinstance(r, Reader):
            found.append(r)
    return tuple(sorted(found, key=lambda r: (-r.priority, r.fmt)))


def reader_for(path: Path) -> Reader | None:
    """The reader that recognises ``path``; None when no format does."""
    return next((r for r in readers() if r.detect(path)), None)


def get_reader(fmt: str) -> Reader:
    for r in readers():
        if r.fmt == fmt:
            return r
    raise InputError(f"input format {fmt!r} is not available in this build")
