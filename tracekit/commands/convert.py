"""`tracekit convert`: Kineto/SGLang JSON and nsys exports -> trace.parquet."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tracekit.commands._common import at_least, handle_errors

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("convert")
    @handle_errors
    def convert_cmd(
        inputs: List[Path] = typer.Argument(..., readable=False, help="Trace files or directories (one capture, any number of ranks)."),
        out: Path = typer.Option(Path("trace.parquet"), "-o", "--out", help="Output trace.parquet."),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing output."),
        rules: Optional[Path] = typer.Option(None, "--rules", readable=False, help="Extra category rules (JSON/YAML), tried before the defaults."),
        jobs: Optional[int] = typer.Option(None, "-j", "--jobs", help="Ranks converted at once. Default 1: one rank at a time, its JSON decoded by all cores (memory of one rank). N>1: N ranks in worker processes, ~N x the memory."),
        quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar or summary."),
        steps_from: Optional[str] = typer.Option(None, "--steps-from", help="Regex: CPU ranges whose name matches are the steps (named groups id, mode, bs, tok optional); default: the built-in step-label grammar."),
    ) -> None:
        """Convert torch.profiler/Kineto JSON (SGLang per-rank files included) or Nsight Systems exports into one trace.parquet."""
        from tracekit.ingest.convert import convert

        at_least("--jobs", jobs, 1)
        res = convert(inputs, out, force=force, rules=rules, jobs=jobs, progress=not quiet, steps_from=steps_from)
        if not quiet:
            mb = res.input_bytes / 1e6
            typer.echo(
                f"wrote {res.out}: {len(res.ranks)} rank(s) {res.ranks if len(res.ranks) <= 16 else ''} {res.rows} rows "
                f"from {mb:.1f} MB in {res.seconds:.2f} s"
            )
            for q in res.quality:
                typer.echo(f"  [{q.get('severity', 'warning')}] {q['code']}: {q['message']}")
