"""``tracekit diff``: compare two trace.parquet captures."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

if TYPE_CHECKING:
    import polars as pl

from tracekit._errors import UsageError
from tracekit.commands._common import handle_errors, warn_read_flags

__all__ = ["register"]


def _counters(path: Path) -> "pl.DataFrame":
    """The counter rows of a trace (power, SM activity), read with a lazy scan."""
    import polars as pl

    from tracekit.schema import scan_trace

    return scan_trace(path).filter(pl.col("kind") == "counter").select("rank", "kind", "ts_ns", "name", "value").collect()


def register(app: typer.Typer) -> None:
    @app.command("diff")
    @handle_errors
    def diff(
        before: Path = typer.Argument(..., readable=False, help="Baseline trace.parquet (or a profiler trace, converted for this run)."),
        after: Path = typer.Argument(..., readable=False, help="Changed trace.parquet (or a profiler trace, converted for this run)."),
        as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON on stdout."),
        html_out: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML page here."),
        force: bool = typer.Option(False, "--force", help="Overwrite the --html file."),
        top: int = typer.Option(15, "--top", help="Kernels to list."),
        labels: Optional[str] = typer.Option(None, "--labels", help="Names of the two runs, e.g. untuned,tuned."),
        width: Optional[int] = typer.Option(
            None, "--width", help="Report width in columns (default: the terminal's width; 80 in a pipe or file, or $COLUMNS)."),
    ) -> None:
        """Compare two captures: time per category, step time p50/p90, tokens/s, collective transfer vs wait,
        power, the kernels whose time changed most, and a short verdict."""
        from tracekit.compare.diff import diff_runs, summarize_result
        from tracekit.api import analyze_result
        from tracekit.schema import atomic_path

        if top < 1:
            raise UsageError("--top must be at least 1")
        if width is not None and width < 40:
            raise UsageError(f"--width {width}: give at least 40 columns")
        if labels:
            parts = [p.strip() for p in labels.split(",")]
            if len(parts) != 2 or not all(parts):
                raise UsageError(f"--labels {labels!r}: give two names separated by a comma")
            names = (parts[0], parts[1])
        else:
            names = (before.stem, after.stem) if before.stem != after.stem else ("before", "after")
        if html_out is not None and html_out.resolve() in (before.resolve(), after.resolve()):
            raise UsageError(f"--html {html_out}: refusing to overwrite an input")
        if html_out is not None:
            from tracekit.schema import check_output_path

            check_output_path(html_out, force=force)  # not a device, FIFO or directory
        from contextlib import ExitStack

        from tracekit.commands._source import trace_source
        from tracekit.schema import read_metadata

        with ExitStack() as stack:  # a profiler's JSON: converted for this run
            paths = [stack.enter_context(trace_source(p)) for p in (before, after)]
            # each run is its analysis result: the windows, steps, tokens/s and collective waits `analyze` reports
            results = [analyze_result(p) for p in paths]
            for r in results:
                warn_read_flags(r.meta)
            runs = [summarize_result(r, label=n, counters=_counters(p)) for r, p, n in zip(results, paths, names)]
            # metadata: device / format / shape comparability notes
            res = diff_runs(runs[0], runs[1], labels=names, top=top,
                            before_meta=read_metadata(paths[0]), after_meta=read_metadata(paths[1]))
        if html_out is not None:
            from tracekit.report.diff_html import render_html

            page = render_html(res)
            with atomic_path(html_out, force=force) as tmp:
                tmp.write_text(page, encoding="utf-8")
        if as_json:
            sys.stdout.write(json.dumps(res.to_json(), default=str, indent=1) + "\n")
        else:
            from tracekit.report.diff_terminal import render_terminal

            render_terminal(res, width=width)
            if html_out is not None:
                typer.echo(f"wrote {html_out}")
