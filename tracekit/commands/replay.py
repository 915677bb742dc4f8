"""`tracekit replay`: what-if predictions from the trace's dependency graph."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from tracekit.commands._common import at_least, handle_errors, warn_read_flags

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("replay")
    @handle_errors
    def replay_cmd(
        trace: Path = typer.Argument(..., readable=False, help="trace.parquet of the baseline run, or its profiler trace (Kineto JSON(.gz), nsys SQLite, a directory of them), converted for this run."),
        what_if: List[str] = typer.Option(
            [], "--what-if", "-w",
            help="Scenario (repeatable): moe_gemm=0.33 | re:fused_moe.*=0.5 | allreduce=bw:400GB/s,lat:5us | "
                 "allreduce=nvlink-h200 | no-host-sync | grouped-experts | cuda-graph[:node=0.3us,launch=10us]; '+' combines."),
        durations_from: Optional[Path] = typer.Option(
            None, "--durations-from", readable=False, help="trace.parquet of the same workload: substitute its per-kernel durations "
                                           "(oracle scenario)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        out: Optional[Path] = typer.Option(None, "--out", help="Write the JSON to this file instead of stdout."),
        force: bool = typer.Option(False, "--force", help="Overwrite --out."),
        no_calibrate: bool = typer.Option(False, "--no-calibrate", help="Do not fit the CPU-gap scale."),
        gap_scale: Optional[float] = typer.Option(None, "--gap-scale", help="Use this CPU-gap scale instead of fitting."),
        width: Optional[int] = typer.Option(
            None, "--width", help="Report width in columns (default: the terminal's width; 80 in a pipe or file, or $COLUMNS)."),
    ) -> None:
        """Replay a trace's dependency graph and predict step time and tokens/s under what-ifs."""
        from tracekit.replay import replay
        from tracekit.commands._source import load_trace
        from tracekit.schema import atomic_path, check_output_path

        if width is not None:
            at_least("--width", width, 40)
        df, meta = load_trace(trace)  # a profiler's JSON: converted for this run
        warn_read_flags(meta)
        target = None
        if durations_from is not None:
            target, target_meta = load_trace(durations_from)
            warn_read_flags(target_meta)
        if out is not None:  # before the work: --out is never one of the traces just read, a device or a directory
            check_output_path(out, force=force)
        # the collective matching of the analysis (one owner; the same instances analyze reports), on the trace's clock
        from tracekit.api import analyze_frame_result

        matched = analyze_frame_result(df, meta, next_win=False).instances_in_input_time()
        res = replay(df, meta, what_if, durations_from=target, calibrate=not no_calibrate, gap_scale=gap_scale,
                     instances=matched if matched.height else None)
        if out is not None:
            with atomic_path(out, force=force) as tmp:
                tmp.write_text(json.dumps(res.to_json(), indent=1, default=str))
        if as_json and out is None:
            json.dump(res.to_json(), sys.stdout, indent=1, default=str)
            sys.stdout.write("\n")
        elif not as_json:
            from tracekit.report.replay_terminal import render_replay

            render_replay(res, width=width)
