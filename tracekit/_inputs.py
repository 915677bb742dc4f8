"""The inputs and published outputs of the running command, so that no output of it replaces one of its inputs
(:func:`tracekit.schema.check_output_path`) and a later failure can name what it kept.

Kept apart from :mod:`tracekit.schema` so that the CLI opens a command's scope without importing polars or
pyarrow (an unreachable ``--cluster`` scheduler is then reported before any heavy import).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["guard_inputs", "note_input", "note_output", "published_outputs", "is_input", "DATASET_META", "profiler_source",
           "is_dataset", "is_profiler_input"]

#: the file of a directory dataset holding the footer metadata (schema + ``tracekit`` JSON)
DATASET_META = "_common_metadata"

#: inputs read inside :func:`guard_inputs` scopes, as (st_dev, st_ino): never the target of an output
_INPUTS: list[set[tuple[int, int]]] = []
#: outputs published (renamed into place) inside each :func:`guard_inputs` scope, for messages after a later failure
_OUTPUTS: list[list[Path]] = []


class guard_inputs:
    """Scope (one CLI command) in which every file read is protected from being written.

    Readers call :func:`note_input`; :func:`check_output_path` (and so every
    atomic write) refuses a target that is the same file (same device and
    inode: also through a symlink or a hard link). Outside a scope nothing
    is recorded, so library callers may rewrite files they read earlier.
    """

    def __enter__(self) -> "guard_inputs":
        _INPUTS.append(set())
        _OUTPUTS.append([])
        return self

    def __exit__(self, *exc: object) -> None:
        _INPUTS.pop()
        _OUTPUTS.pop()


def note_output(path: str | os.PathLike[str]) -> None:
    """Record ``path`` as an output the running command has published complete (see :func:`published_outputs`)."""
    if _OUTPUTS and Path(path) not in _OUTPUTS[-1]:
        _OUTPUTS[-1].append(Path(path))


def published_outputs() -> list[Path]:
    """The outputs the running command has published so far (a later failure, e.g. of stdout, names them as kept)."""
    return list(_OUTPUTS[-1]) if _OUTPUTS else []


def note_input(path: str | os.PathLike[str]) -> None:
    """Record ``path`` (a file or directory being read) as an input of the running command."""
    if not _INPUTS:
        return
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    _INPUTS[-1].add((st.st_dev, st.st_ino))
    if stat.S_ISDIR(st.st_mode):  # an input directory: its files are inputs too (nsys parquetdir, trace dirs)
        try:
            with os.scandir(path) as it:
                for ent in it:
                    try:
                        est = ent.stat()
                    except OSError:
                        continue
                    _INPUTS[-1].add((est.st_dev, est.st_ino))
        except OSError:
            pass


def is_input(st: os.stat_result) -> bool:
    """Whether the file of ``st`` (same device and inode) was read inside an open :class:`guard_inputs` scope."""
    return any((st.st_dev, st.st_ino) in s for s in _INPUTS)


def profiler_source(p: Path) -> str | None:
    """What a file that ``tracekit convert`` reads looks like from its first bytes: gzip, JSON, an Nsight Systems
    SQLite export; None otherwise (a trace.parquet among them)."""
    try:
        with open(p, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    if head.startswith(b"\x1f\x8b"):
        return "gzip-compressed (a profiler's JSON trace?)"
    if head.startswith(b"SQLite format 3\x00"):
        return "an SQLite database (an Nsight Systems export?)"
    if head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"{", b"["):
        return "JSON (a profiler's trace?)"
    return None


def is_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory dataset (a directory holding :data:`DATASET_META`)."""
    return Path(path).is_dir() and (Path(path) / DATASET_META).is_file()


def is_profiler_input(p: Path) -> bool:
    """Whether ``p`` is a profiler's output (a file :func:`profiler_source` recognizes, or a directory that is not a
    tracekit dataset) rather than a trace.parquet or dataset: the commands that read a trace convert it for the run."""
    if p.is_dir():
        return not is_dataset(p)
    return p.is_file() and profiler_source(p) is not None
