"""Public library surface used by the CLI and notebooks.

``analyze(path)`` returns the documented, stable ``--json`` object
(``docs/analyze_json.md``); reporters render it, they never compute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import polars as pl

from tracekit.advice.nextwin import next_win_stage
from tracekit.analysis.stage.pipeline import ANALYSIS_VERSION, FrameSource, RankRunner, ScanSource, ranks_filter, run_analysis
from tracekit.analysis.result import AnalysisResult
from tracekit.ingest.convert import ConvertResult, convert
from tracekit._errors import InputError, RankError
from tracekit.schema import as_trace_meta, open_trace, trace_ranks

__all__ = ["analyze", "analyze_frame", "analyze_result", "analyze_kept", "analyze_frame_result", "AnalysisResult", "convert", "ConvertResult",
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
    lf, meta = open_trace(path, ranks)  # validated: one-line errors or flagged repairs (tracekit.trace_check)
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


def analyze_kept(
    path: str | Path,
    *,
    ranks: Sequence[int] | None = None,
    runner_for: Callable[[list[int] | None], RankRunner | None] | None = None,
    **opts: Any,
) -> AnalysisResult:
    """``analyze --keep-going``: :func:`analyze_result`, but a rank that fails (:class:`~tracekit._errors.RankError`:
    its rows cannot be read, or its cluster task failed) is left out and the analysis runs again on the others;
    each such rank gets a ``rank_failed`` quality flag (severity error). The answer is then exactly
    ``analyze_result(path, ranks=<the others>)`` plus those flags. Every rank failing is an :class:`InputError`.

    ``runner_for(ranks)``: the runner for one attempt over ``ranks`` (None: all; default: this process)."""
    make = runner_for if runner_for is not None else (lambda _r: None)
    keep: list[int] | None = list(ranks) if ranks is not None else None
    failed: list[tuple[int, str]] = []
    while True:
        try:
            res = analyze_result(path, ranks=keep, runner=make(keep), **opts)
            break
        except RankError as e:
            failed.append((e.rank, str(e)))
            if keep is None:
                keep = trace_ranks(path)
            if e.rank not in keep:
                raise  # not a rank of this attempt: nothing to leave out
            keep = [r for r in keep if r != e.rank]
            if not keep:
                raise InputError(f"{path}: every rank failed; the first: {failed[0][1]}") from None
    return flag_failed_ranks(res, failed)


def flag_failed_ranks(res: AnalysisResult, failed: Sequence[tuple[int, str]]) -> AnalysisResult:
    """``res`` with one ``rank_failed`` quality flag (severity error) per ``(rank, message)`` left out."""
    if not failed:
        return res
    import dataclasses

    import msgspec

    from tracekit.analysis.sections import QualityItem

    flags = tuple(QualityItem(code="rank_failed", message=f"{msg}; results cover the other ranks", severity="error", rank=r)
                  for r, msg in failed)
    return dataclasses.replace(res, sections=msgspec.structs.replace(res.sections, quality=res.sections.quality + flags))


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
    return run_analysis(FrameSource(df), as_trace_meta(meta), window=window, skip_steps=skip_steps, trim_transient=trim_transient, top=top,
                        cross_rank=cross_rank, after=(next_win_stage,) if next_win else ())

