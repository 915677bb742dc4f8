"""Public library surface used by the CLI and notebooks.

``analyze(path)`` returns the documented, stable ``--json`` object
(``docs/analyze_json.md``); reporters render it, they never compute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import polars as pl

from tracekit.advice.nextwin import next_win_stage
from tracekit.analysis.stage.pipeline import ANALYSIS_VERSION, FrameSource, RankRunner, ScanSource, ranks_filter, run_analysis
from tracekit.analysis.result import AnalysisResult
from tracekit.ingest.convert import ConvertResult, convert
from tracekit.schema import open_trace

__all__ = ["analyze", "analyze_frame", "analyze_result", "analyze_frame_result", "AnalysisResult", "convert", "ConvertResult",
           "ANALYSIS_VERSION"]


def analyze(
    path: str | Path,
    *,
    window: str | None = None,
    skip_steps: int = 0,
    trim_transient: bool = True,
    top: int = 5,
    ranks: Sequence[int] | None = None,
    cross_rank: bool = True,
    steps_from: str | None = None,
) -> dict[str, Any]:
    """Analyze a ``trace.parquet``; returns the ``--json`` object (see docs/analyze_json.md).

    ``steps_from``: a regex; ranges matching it become the steps instead of those found at
    convert time (tracekit.steplabels). This reads the whole trace into memory once.

    Streams: a small cross-rank pass over lazy scans, then the per-rank analyses one rank at
    a time (``tracekit.analysis.stage.pipeline``), so memory is one rank's rows plus the collective
    tables, never the whole trace. Same result as :func:`analyze_frame` on the whole frame.
    """
    return analyze_result(path, window=window, skip_steps=skip_steps, trim_transient=trim_transient, top=top, ranks=ranks,
                          cross_rank=cross_rank, steps_from=steps_from).to_json()


def analyze_result(
    path: str | Path,
    *,
    window: str | None = None,
    skip_steps: int = 0,
    trim_transient: bool = True,
    top: int = 5,
    ranks: Sequence[int] | None = None,
    cross_rank: bool = True,
    steps_from: str | None = None,
    runner: RankRunner | None = None,
) -> AnalysisResult:
    """:func:`analyze` as the typed :class:`~tracekit.analysis.result.AnalysisResult` every view reads.

    ``runner``: where the per-rank work runs (:class:`~tracekit.analysis.stage.pipeline.RankRunner`; default here,
    one rank at a time; ``tracekit.cluster.analyze`` passes a Dask cluster's)."""
    lf, meta = open_trace(path)  # validated: one-line errors or flagged repairs (tracekit.trace_check)
    lf = ranks_filter(lf, ranks)
    source: FrameSource | ScanSource = ScanSource(path, lf)
    if steps_from is not None:  # re-derived steps need the whole trace in memory once
        from tracekit.ingest.common import resteps
        from tracekit.steplabels import compile_steps_from

        source = FrameSource(resteps(lf.collect(), compile_steps_from(steps_from) or steps_from))
        meta = {**meta, "steps_from": steps_from}
    res = run_analysis(source, meta, window=window, skip_steps=skip_steps, trim_transient=trim_transient, top=top,
                       cross_rank=cross_rank, after=(next_win_stage,), runner=runner)
    return res.with_trace(str(path))


def analyze_frame(
    df: pl.DataFrame,
    meta: dict[str, Any],
    *,
    window: str | None = None,
    skip_steps: int = 0,
    trim_transient: bool = True,
    top: int = 5,
    cross_rank: bool = True,
) -> dict[str, Any]:
    """Same as :func:`analyze` on an in-memory frame (all ranks at once: the reference for the streaming path)."""
    return analyze_frame_result(df, meta, window=window, skip_steps=skip_steps, trim_transient=trim_transient, top=top,
                                cross_rank=cross_rank).to_json()


def analyze_frame_result(
    df: pl.DataFrame,
    meta: dict[str, Any],
    *,
    window: str | None = None,
    skip_steps: int = 0,
    trim_transient: bool = True,
    top: int = 5,
    cross_rank: bool = True,
    next_win: bool = True,
) -> AnalysisResult:
    """:func:`analyze_frame` as the typed :class:`~tracekit.analysis.result.AnalysisResult` (``next_win=False``: without
    the replayed next-win section)."""
    return run_analysis(FrameSource(df), meta, window=window, skip_steps=skip_steps, trim_transient=trim_transient, top=top,
                        cross_rank=cross_rank, after=(next_win_stage,) if next_win else ())

