"""`tracekit export`: the trace in other viewers' formats (Perfetto / Chrome JSON)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from tracekit import _interrupt
from tracekit.commands._common import handle_errors, warn_read_flags

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("export")
    @handle_errors
    def export_cmd(
        trace: Path = typer.Argument(..., readable=False, help="trace.parquet (from `tracekit capture` or `tracekit convert`), or a profiler's trace: Kineto JSON(.gz), nsys SQLite, or a directory of them, converted for this run."),
        perfetto: Optional[Path] = typer.Option(
            None, "--perfetto", help="Write a merged multi-rank Chrome-JSON trace (*.json or *.json.gz) for ui.perfetto.dev."),
        cpu: bool = typer.Option(False, "--cpu", help="Also export CPU ops / runtime calls with launch → kernel flows."),
        no_analysis: bool = typer.Option(False, "--no-analysis", help="Skip the analysis (no stall instants)."),
        force: bool = typer.Option(False, "--force", help="Overwrite the output file."),
    ) -> None:
        """Export a trace: one process per rank, one track per GPU stream, categories on slices,
        counters as counter tracks, collectives as flows across ranks, stalls as instant events."""
        from tracekit._errors import UsageError
        from tracekit.commands.timeline import _analysis
        from tracekit.report.perfetto import export_perfetto
        from tracekit.commands._source import load_trace

        if perfetto is None:
            raise UsageError("export: choose a format, e.g. --perfetto out.json.gz")
        from tracekit.schema import check_output_path, note_input

        note_input(trace)
        check_output_path(perfetto, force=force)  # not the input, a device, a FIFO or a directory
        df, meta = load_trace(trace)  # a profiler's JSON: converted for this run
        warn_read_flags(meta)
        _interrupt.check("export")
        analysis = None if no_analysis else _analysis(df, meta)
        _interrupt.check("export")
        st = export_perfetto(df, meta, perfetto, analysis=analysis, force=force, include_cpu=cpu)
        print(f"wrote {perfetto} ({st['bytes'] / 1e6:.1f} MB): {st['events']:,} events, {st['slices']:,} slices, "
              f"{st['flows']:,} flows, {st['counters']:,} counter samples, {st['instants']} stall instants"
              + (f"; {st['clipped']:,} slices clipped to nest" if st["clipped"] else ""), file=sys.stderr)
