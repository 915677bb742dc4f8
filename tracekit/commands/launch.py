"""``tracekit launch -- python -m sglang.launch_server ...``: run SGLang with tracekit's forward hook."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tracekit.commands._common import handle_errors

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    @handle_errors
    def launch_cmd(
        ctx: typer.Context,
        step_dir: Optional[Path] = typer.Option(None, "--step-dir", help="Where ranks write per-forward step records (default: a new temp dir)."),
        capture_duration: Optional[str] = typer.Option(None, "--capture-duration", help="Once the server answers, capture it for this long (30s, 2m)."),
        output: Path = typer.Option(Path("trace.parquet"), "-o", "--output", help="Output trace.parquet of the capture."),
        force: bool = typer.Option(False, "--force", help="Overwrite the output."),
        load: Optional[str] = typer.Option(None, "--load", help="Drive N concurrent requests during the capture (N or N1,N2,... sweep)."),
        steps: Optional[int] = typer.Option(None, "--steps", help="Stop the profile after this many forward steps instead of the duration."),
        with_stack: bool = typer.Option(False, "--with-stack", help="Record Python stacks (large traces)."),
        record_shapes: bool = typer.Option(False, "--record-shapes", help="Record operator input shapes."),
        profile_dir: Optional[Path] = typer.Option(None, "--profile-dir", help="Where the server writes its traces (a unique subdir is made)."),
        exit_after_capture: bool = typer.Option(False, "--exit-after-capture", help="Stop the server after the capture."),
        ready_timeout: float = typer.Option(1800.0, "--ready-timeout", help="Seconds to wait for the server to answer."),
    ) -> None:
        """Run an SGLang server with a tk.fwd[...] NVTX + record_function range and a step record per forward.

        Everything after `--` is the server command. Works with and without SGLang's plugin system.
        """
        from tracekit.capture.launcher import launch

        cmd = [a for a in ctx.args]
        if cmd[:1] == ["launch"]:
            cmd = cmd[1:]
        if cmd[:1] == ["--"]:
            cmd = cmd[1:]
        secs = None
        if capture_duration is not None:
            from tracekit.commands.capture import parse_duration

            secs = parse_duration(capture_duration)
        kw = dict(force=force, load=load, num_steps=steps, with_stack=with_stack, record_shapes=record_shapes,
                  output_dir=profile_dir)
        res = launch(cmd, step_dir=step_dir, capture_duration_s=secs, out=output, exit_after_capture=exit_after_capture,
                     ready_timeout_s=ready_timeout, capture_kwargs=kw)
        if res.capture is not None:
            for lv in res.capture.levels:
                ld = lv.load or {}
                extra = (f", load {ld['concurrency']}: {ld['output_tokens_per_s']:,.0f} out tok/s, "
                         f"{ld['requests_per_s']:.1f} req/s, p50 {ld['latency_ms_p50'] or 0:,.0f} ms") if ld else ""
                typer.echo(f"wrote {lv.out} ({len(lv.files)} rank file(s){extra})")
            for q in res.capture.quality:
                typer.echo(f"  [{q.severity}] {q.code}: {q.message}")
        if res.returncode:
            raise typer.Exit(res.returncode)
