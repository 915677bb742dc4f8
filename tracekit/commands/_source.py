"""A profiler's own output given where a trace.parquet is expected: converted for this command, then removed.

Contract of :func:`trace_source`: a ``trace.parquet`` (or a tracekit dataset directory) is yielded as it is. A
file that ``tracekit convert`` reads (a Kineto/Chrome JSON, plain or gzip, an Nsight Systems SQLite export) or a
directory of such files (one capture's ranks, as HolisticTraceAnalysis takes a trace directory) is converted in
this process into a temporary ``trace.parquet``, which is yielded and removed when the scope ends (also on an
error or Ctrl-C). The input is only read. One line on stderr says so and names the command that keeps the
Parquet for the next run.

Why in-process: a user's first command is usually ``tracekit analyze trace.json.gz``; converting in the same
process also saves the second interpreter start and library imports of running ``convert`` then ``analyze``
(about 0.5 CPU-s). The temporary file is written with lz4, not zstd: it is read once, right away.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tracekit._inputs import is_profiler_input
from tracekit._memory import release_memory
from tracekit.commands._common import say

__all__ = ["trace_source", "load_trace"]


@contextmanager
def trace_source(path: Path, *, keep_going: bool = False) -> Iterator[Path]:
    """``path`` when it is a trace.parquet or dataset, else a temporary trace.parquet converted from it (module doc).

    ``keep_going`` (the command's ``--keep-going``): a rank that cannot be converted is left out and flagged
    ``rank_failed`` (``failed_ranks`` in the metadata), as ``tracekit convert --keep-going`` does; the command
    then reports it with the ranks its own analysis left out."""
    if not is_profiler_input(path):
        yield path
        return
    from tracekit import _interrupt
    from tracekit._errors import OutputError, os_reason
    from tracekit.ingest.convert import convert

    try:
        with _interrupt.deferred():  # a Ctrl-C between the creation and the assignment would leak the directory
            tmp = Path(tempfile.mkdtemp(prefix="tracekit-convert-"))
    except OSError as e:
        raise OutputError(f"{tempfile.gettempdir()}: cannot create a temporary directory to convert {path} "
                          f"{os_reason(e, writing=True)}; set TMPDIR to a writable directory, or run "
                          f"`tracekit convert {shlex.quote(str(path))}` first") from None
    try:
        out = tmp / "trace.parquet"
        res = convert([path], out, compression="lz4", keep_going=keep_going)  # read once, right away: the cheaper codec
        release_memory(arrow=True)  # the conversion's freed heap goes back before the analysis allocates its own
        ranks = f"{len(res.ranks)} rank" + ("s" if len(res.ranks) != 1 else "")
        say(f"tracekit: {path}: converted for this run ({ranks}, {res.rows:,} rows); "
            f"`tracekit convert {shlex.quote(str(path))}` saves it as trace.parquet for the next")
        yield out
    finally:
        with _interrupt.deferred():  # the cleanup is never cut short by a Ctrl-C
            shutil.rmtree(tmp, ignore_errors=True)


def load_trace(path: Path) -> tuple[Any, dict[str, Any]]:
    """``read_trace(path)`` (the whole trace in memory: timeline, export, replay) for a trace.parquet, a dataset
    or a profiler's output (converted for this run by :func:`trace_source`, removed once read)."""
    from tracekit.schema import read_trace

    with trace_source(path) as parquet:
        df, meta = read_trace(parquet)
    return df, meta
