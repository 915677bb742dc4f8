"""`tracekit convert`: Kineto/SGLang JSON and nsys exports -> trace.parquet."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from tracekit.commands._common import at_least, handle_errors, parquet_output

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
        layout: Optional[str] = typer.Option(None, "--layout", help="file: one trace.parquet (the default); dataset: a directory hive-partitioned by rank (rank=N/part-0.parquet + _common_metadata), the default with --cluster. Every command reads either."),
        cluster: Optional[str] = typer.Option(None, "--cluster", help="Convert each source as a task of a Dask cluster: local:N (N workers on this host, bound to loopback) or a scheduler address (tcp://HOST:PORT) or file (*.json). Sources and -o must be paths the workers can reach (docs/cluster.md)."),
        keep_going: bool = typer.Option(False, "--keep-going", help="A source that fails is flagged (rank_failed) and the other ranks are converted; the exit code is still non-zero."),
    ) -> None:
        """Convert torch.profiler/Kineto JSON (SGLang per-rank files included) or Nsight Systems exports into one trace.parquet."""
        if cluster is not None:  # an unreachable scheduler fails now, in one line, before the heavy imports
            from tracekit.cluster.engine import probe

            probe(cluster)
        from tracekit.ingest.convert import convert

        at_least("--jobs", jobs, 1)
        if all(os.path.realpath(out) != os.path.realpath(i) for i in inputs):  # an input as -o: convert's message says so
            parquet_output("-o", out)
        if cluster is not None and jobs is not None:
            from tracekit._errors import UsageError

            raise UsageError("--jobs and --cluster: choose one (the cluster's workers convert the ranks)")
        kw = dict(force=force, rules=rules, progress=not quiet, steps_from=steps_from, keep_going=keep_going)
        if cluster is None:
            res = convert(inputs, out, jobs=jobs, layout=layout or "file", **kw)  # type: ignore[arg-type]
        else:
            from tracekit.cluster.engine import cluster_client

            with cluster_client(cluster) as client:  # workers may run elsewhere: absolute paths
                res = convert([p.absolute() for p in inputs], out.absolute(), layout=layout or "dataset",
                              executor=client.get_executor(pure=False), **kw)  # type: ignore[arg-type, no-untyped-call]
        from tracekit.schema import note_output

        note_output(res.out)  # complete: a summary that cannot be printed says the trace is kept
        if not quiet:
            mb = res.input_bytes / 1e6
            typer.echo(
                f"wrote {res.out}: {len(res.ranks)} rank(s) {res.ranks if len(res.ranks) <= 16 else ''} {res.rows} rows "
                f"from {mb:.1f} MB in {res.seconds:.2f} s"
            )
            for q in res.quality:
                typer.echo(f"  [{q.get('severity', 'warning')}] {q['code']}: {q['message']}")
        failed = res.metadata.get("failed_ranks") or []
        if failed:  # --keep-going: the output is written, but it is not the whole capture
            import sys

            names = ", ".join(str(f["rank"]) if f["rank"] is not None else Path(f["source_file"]).name for f in failed)
            print(f"tracekit: error: {len(failed)} source(s) failed (rank {names}); the other ranks are in {res.out}, "
                  "flagged rank_failed", file=sys.stderr)
            raise typer.Exit(2)
