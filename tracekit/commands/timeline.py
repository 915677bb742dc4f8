"""`tracekit timeline`: one self-contained offline HTML timeline of a trace."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from tracekit import _interrupt
from tracekit.commands._common import at_least, handle_errors, warn_read_flags

__all__ = ["register"]


def _analysis(df: Any, meta: dict[str, Any]) -> dict[str, Any] | None:
    """The analysis the page reads (summary, matched collectives, profiled spans), from the one
    :class:`~tracekit.analysis.result.AnalysisResult`; a failed analysis costs the summary, not the page."""
    from tracekit.api import analyze_frame_result
    from tracekit.report.timeline_data import views_analysis

    try:
        return views_analysis(analyze_frame_result(df, meta))
    except Exception as e:  # noqa: BLE001 - the timeline is still useful without the summary
        print(f"tracekit: warning: analysis failed ({type(e).__name__}: {e}); the page has no summary", file=sys.stderr)
        return None


def register(app: typer.Typer) -> None:
    @app.command("timeline")
    @handle_errors
    def timeline_cmd(
        trace: Path = typer.Argument(..., readable=False, help="trace.parquet (from `tracekit capture` or `tracekit convert`), or a profiler's trace: Kineto JSON(.gz), nsys SQLite, or a directory of them, converted for this run."),
        out: Path = typer.Option(..., "-o", "--out", help="Output HTML file (self-contained, works offline)."),
        window: Optional[str] = typer.Option(
            None, "--window", help="Detail window relative to capture start, e.g. 12.30s:12.45s (units ns/us/ms/s)."),
        step: Optional[int] = typer.Option(None, "--step", help="Detail window = this step (across ranks)."),
        max_segments: int = typer.Option(100_000, "--max-segments", help="Ops drawn exactly in the detail; the rest are folded."),
        no_analysis: bool = typer.Option(False, "--no-analysis", help="Skip the analysis summary at the top."),
        all_counters: bool = typer.Option(False, "--all-counters", help="Show every counter, not only power / SM / tensor / PCIe."),
        force: bool = typer.Option(False, "--force", help="Overwrite the output file."),
    ) -> None:
        """Write an HTML timeline: analysis summary, whole-capture overview per rank (category heat map,
        power / SM / PCIe counters) and detailed per-stream kernel lanes for a window (default: a few
        representative steps, or around the worst stall)."""
        from tracekit._errors import UsageError
        from tracekit.report.timeline_html import render_timeline
        from tracekit.commands._source import load_trace

        at_least("--max-segments", max_segments, 0)
        if window is not None and step is not None:
            raise UsageError("--window and --step both choose the detail window; pass one")
        from tracekit.schema import check_output_path, note_input

        note_input(trace)
        check_output_path(out, force=force)  # not the input, a device, a FIFO or a directory
        df, meta = load_trace(trace)  # a profiler's JSON: converted for this run
        warn_read_flags(meta)
        _interrupt.check("timeline")
        analysis = None if no_analysis else _analysis(df, meta)
        _interrupt.check("timeline")
        res = render_timeline(df, meta, analysis, out, window=window, step=step, force=force,
                              max_segments=max_segments, title=trace.name, all_counters=all_counters)
        folded = f", {res['ops_folded']:,} folded" if res["ops_folded"] else ""
        print(f"wrote {out} ({res['bytes'] / 1e6:.1f} MB): {res['lanes']} lanes, {res['ops_in_view']:,} ops in the detail view "
              f"({res['ops_embedded']:,} embedded{folded}); detail = {res['window_reason']}", file=sys.stderr)
