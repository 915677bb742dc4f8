"""`tracekit analyze`: where GPU time goes, who waits for whom, per-step statistics."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from tracekit import _interrupt
from tracekit.commands._common import at_least, handle_errors

if TYPE_CHECKING:
    from tracekit.analysis.result import AnalysisResult

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("analyze")
    @handle_errors
    def analyze_cmd(
        trace: Path = typer.Argument(..., readable=False, help="trace.parquet (from `tracekit capture` or `tracekit convert`), or a profiler's trace: Kineto JSON(.gz), nsys SQLite, or a directory of them, converted for this run."),
        as_json: bool = typer.Option(False, "--json", help="Print the stable JSON object (docs/analyze_json.md)."),
        window: Optional[str] = typer.Option(None, "--window", help="Time range relative to capture start, e.g. 12.30s:12.45s."),
        skip_steps: int = typer.Option(0, "--skip-steps", help="Ignore the first N profiled steps."),
        no_trim: bool = typer.Option(False, "--no-trim", help="Keep the profiler-start transient."),
        top: int = typer.Option(5, "--top", help="Kernels listed per category."),
        html: Optional[Path] = typer.Option(None, "--html", help="Also write the timeline HTML to this file."),
        force: bool = typer.Option(False, "--force", help="Overwrite --html output."),
        width: Optional[int] = typer.Option(
            None, "--width", help="Report width in columns (default: the terminal's width; 80 in a pipe or file, or $COLUMNS)."),
        steps_from: Optional[str] = typer.Option(None, "--steps-from", help="Regex: CPU ranges whose name matches are the steps (named groups id, mode, bs, tok optional)."),
        cluster: Optional[str] = typer.Option(None, "--cluster", help="Run the per-rank analyses as tasks of a Dask cluster: local:N (N workers on this host, bound to loopback) or a scheduler address (tcp://HOST:PORT) or file (*.json); the trace must be a path the workers can read. Same JSON as without it."),
        keep_going: bool = typer.Option(False, "--keep-going", help="A rank that cannot be read (a damaged partition or file; with --cluster also a task that keeps failing) is left out and flagged rank_failed, and the other ranks are analyzed; the exit code is then 2."),
    ) -> None:
        """Analyze a trace: exclusive time split per rank, top kernels, collectives, stalls, idle causes, PCIe, power, steps."""
        if cluster is not None:  # an unreachable scheduler fails now, in one line, before the heavy imports
            from tracekit.cluster.engine import probe

            probe(cluster)
        from tracekit.api import analyze_result

        at_least("--skip-steps", skip_steps, 0)
        at_least("--top", top, 0)
        if width is not None:
            at_least("--width", width, 40)
        if html is not None:
            from tracekit.schema import check_output_path, note_input

            note_input(trace)
            check_output_path(html, force=force)
        opts = dict(window=window, skip_steps=skip_steps, trim_transient=not no_trim, top=top, steps_from=steps_from)
        if cluster is not None:  # the workers read the path: a profiler's JSON is converted first (the error says how)
            from tracekit.cluster.analyze import analyze_cluster
            from tracekit.cluster.engine import cluster_client

            with cluster_client(cluster) as client:
                result = analyze_cluster(client, trace, keep_going=keep_going, **opts)
            _report(trace, trace, result.with_trace(str(trace)), keep_going, html, force, as_json, width)
            return
        from tracekit.commands._source import trace_source

        with trace_source(trace, keep_going=keep_going) as parquet:  # a profiler's JSON: converted for this run
            if keep_going:
                from tracekit.api import analyze_kept

                result = analyze_kept(parquet, **opts)  # type: ignore[arg-type]
            else:
                result = analyze_result(parquet, **opts)  # type: ignore[arg-type]
            _report(trace, parquet, result.with_trace(str(trace)), keep_going, html, force, as_json, width)


def _report(trace: Path, parquet: Path, result: AnalysisResult, keep_going: bool, html: Optional[Path], force: bool,
            as_json: bool, width: Optional[int]) -> None:
    """Write the answer: the timeline HTML (``--html``), then the JSON or the report; exit 2 when ``--keep-going``
    left ranks out. ``parquet``: the trace read (``trace`` itself, or its conversion for this run)."""
    _interrupt.check("analyze")
    failed = _left_out(parquet, result, converted=parquet != trace) if keep_going else []
    if html is not None:
        from tracekit.schema import read_trace

        from tracekit.report.timeline_data import views_analysis
        from tracekit.report.timeline_html import render_timeline

        df, meta = read_trace(parquet, ranks=_analyzed_ranks(parquet, failed) if failed else None)
        render_timeline(df, meta, views_analysis(result), html, force=force)
    if as_json:
        json.dump(result.to_json(), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        from tracekit.report.terminal import render_analysis

        render_analysis(result.sections, width=width)
    if failed:  # --keep-going: the answer is written, but it is not the whole capture (as convert --keep-going)
        print(f"tracekit: error: {len(failed)} rank(s) failed (rank {', '.join(map(str, failed))}); the result covers "
              "the other ranks, flagged rank_failed", file=sys.stderr)
        raise typer.Exit(2)


def _left_out(trace: Path, result: AnalysisResult, *, converted: bool = False) -> list[int]:
    """The ranks this analysis left out (``--keep-going``): flagged ``rank_failed``, and not already missing from the
    trace (a rank that failed at convert time is in the metadata's ``failed_ranks``: `convert` reported it), unless
    the trace was ``converted`` for this command (then this command is the one to report it)."""
    from tracekit.schema import read_metadata

    listed = None if converted else read_metadata(trace).get("failed_ranks")
    before = {f.get("rank") for f in listed if isinstance(f, dict)} if isinstance(listed, list) else set()
    return sorted({q.rank for q in result.sections.quality if q.code == "rank_failed" and isinstance(q.rank, int)} - before)


def _analyzed_ranks(trace: Path, failed: list[int]) -> list[int]:
    from tracekit.schema import trace_ranks

    return [r for r in trace_ranks(trace) if r not in failed]
