"""``tracekit capture``: record a trace.parquet from an SGLang server, the built-in workload or a program."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List, Optional

import typer

from tracekit._errors import UsageError
from tracekit.commands._common import handle_errors, stopped_early

__all__ = ["register", "parse_duration"]

DEFAULT_SGLANG_URL = "http://127.0.0.1:30000"


def parse_duration(text: str, flag: str = "--duration") -> float:
    """``30s``, ``2m``, ``1.5`` (seconds), ``500ms`` -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min|h)?\s*", text or "")
    if not m:
        raise UsageError(f"{flag} {text!r}: use a number with s, m or ms (e.g. 30s)")
    v = float(m.group(1))
    scale = {"ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[m.group(2)]
    return v * scale


#: CPU ranks allowed per core without --oversubscribe (the tiny gloo workload shares cores well up to this)
CPU_RANKS_PER_CORE = 4
#: CPU ranks allowed at all, even with --oversubscribe (each is a process with its own torch)
MAX_CPU_RANKS = 1024


def check_cpu_ranks(device: str, world: int, oversubscribe: bool) -> None:
    """Bound the CPU rank count by the cores (GPU ranks are bounded by the visible GPUs in resolve_device)."""
    if device != "cpu":
        return
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    limit = max(8, CPU_RANKS_PER_CORE * cores)
    if world > MAX_CPU_RANKS:
        raise UsageError(f"--ranks {world}: at most {MAX_CPU_RANKS} CPU ranks (one process each)")
    if world > limit and not oversubscribe:
        raise UsageError(f"--ranks {world}: at most {limit} CPU ranks on {cores} core(s) ({CPU_RANKS_PER_CORE} per core); "
                         "pass --oversubscribe to run more")


def _sglang_detected(url: str) -> bool:
    from tracekit.capture.sglang_client import detect_server

    try:
        return bool(detect_server(url, 0.5))
    except Exception:  # noqa: BLE001 - detection must never break the default path
        return False


def _capture_program(program: List[str], output: Path, *, duration: Optional[str], delay: Optional[str],
                     start_at: Optional[str], window: str, steps: Optional[int], after: str,
                     steps_from: Optional[str], force: bool, keep_raw: Optional[Path], telemetry: bool,
                     module_context: bool = False) -> None:
    from tracekit.capture.external import run_external
    from tracekit.capture.window import WindowSpec

    if steps is not None and steps < 1:
        raise UsageError(f"--steps {steps}: must be >= 1")
    win = parse_duration(window, "--window")
    if win <= 0:
        raise UsageError(f"--window {window}: must be > 0")
    spec = WindowSpec(
        delay_s=parse_duration(delay, "--delay") if delay else 0.0,
        start_at=start_at or None,
        duration_s=parse_duration(duration) if duration else None,
        steps=steps,
        window_s=win,
    )
    res = run_external(program, output, spec=spec, after=after, steps_from=steps_from, force=force,
                       keep_raw=keep_raw, telemetry=telemetry, module_context=module_context)
    cap = res.metadata.get("capture", {})
    s = cap.get("summary", {})
    w = cap.get("window_ns") or [0, 0]
    print(
        f"tracekit: wrote {output} (capture window {(w[1] - w[0]) / 1e9:.2f} s, "
        f"{len(cap.get('profiler_windows', []))} profiler windows, {s.get('steps_profiled', 0)} profiled steps; "
        f"program {res.program_s:.1f} s, conversion {res.convert_s:.1f} s)"
    )
    for q in res.metadata.get("quality", []):
        print(f"tracekit: quality: {q['code']}: {q['message']}", file=sys.stderr)
    stopped_early(res.interrupted, output)


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
    @handle_errors
    def capture(
        ctx: typer.Context,
        duration: Optional[str] = typer.Option(None, "--duration", "-d", help="How long to capture (30s, 2m, 500ms; default 30s; a program: until it ends)."),
        delay: Optional[str] = typer.Option(None, "--delay", help="Program: start capturing this long after it starts (like nsys --delay)."),
        start_at: Optional[str] = typer.Option(None, "--start-at", help="Program: start at the first step ('step') or at the first record_function range named NAME (after --delay)."),
        window: str = typer.Option("1s", "--window", help="Program: one profiler window lasts at most this long; a longer capture is a series of windows (bounded memory)."),
        after: str = typer.Option("stop", "--after", help="Program: once its trace is on disk, 'stop' it (SIGINT, then SIGTERM) or let it 'finish'."),
        steps_from: Optional[str] = typer.Option(None, "--steps-from", help="Program: record_function names matching this regex also count as steps."),
        output: Path = typer.Option(Path("trace.parquet"), "-o", "--output", help="Output trace.parquet."),
        force: bool = typer.Option(False, "--force", help="Overwrite the output."),
        workload: bool = typer.Option(False, "--workload", help="Run the built-in workload even if an SGLang server answers."),
        url: str = typer.Option(DEFAULT_SGLANG_URL, "--url", help="SGLang server to look for first."),
        sglang: Optional[str] = typer.Option(None, "--sglang", help="Capture this SGLang server (http://HOST:PORT); error if it does not answer."),
        load: Optional[str] = typer.Option(None, "--load", help="SGLang: drive N concurrent requests during capture; a list (256,512,1024) captures each level."),
        steps: Optional[int] = typer.Option(None, "--steps", help="SGLang or program: stop profiling after N steps instead of the duration."),
        with_stack: bool = typer.Option(False, "--with-stack", help="SGLang: record Python stacks (more overhead)."),
        profile_dir: Optional[Path] = typer.Option(None, "--profile-dir", help="SGLang: directory the server writes its traces to (default: a fresh temp dir)."),
        poll_timeout: float = typer.Option(300.0, "--poll-timeout", help="SGLang: seconds to wait for every rank's trace file."),
        device: str = typer.Option("auto", "--device", help="auto (all visible GPUs, else CPU), cuda or cpu."),
        ranks: Optional[int] = typer.Option(None, "--ranks", "-n", help="Tensor-parallel ranks (default: all GPUs, or 8 on CPU)."),
        moe_impl: str = typer.Option("grouped", "--moe-impl", help="loop (per-expert small GEMMs, host sync) or grouped (one grouped GEMM)."),
        host_sync: bool = typer.Option(False, "--host-sync", help="Add a .item() host sync per layer."),
        cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help="Replay decode steps from CUDA graphs (grouped, GPU only)."),
        layers: Optional[int] = typer.Option(None, "--layers", help="MoE layers (default 4 on GPU, 2 on CPU)."),
        hidden: Optional[int] = typer.Option(None, "--hidden", help="Hidden size (default 6144 on GPU, 256 on CPU)."),
        experts: Optional[int] = typer.Option(None, "--experts", help="Routed experts (default 256 on GPU, 64 on CPU)."),
        max_batch: Optional[int] = typer.Option(None, "--max-batch", help="Running requests at most (64 GPU / 8 CPU)."),
        prompt_len: Optional[int] = typer.Option(None, "--prompt-len", help="Prompt tokens per prefill request."),
        delay_rank: Optional[int] = typer.Option(None, "--delay-rank", help="Straggler: rank to delay."),
        delay_ms: float = typer.Option(0.0, "--delay-ms", help="Straggler: host delay in ms before the forward."),
        delay_every: int = typer.Option(1, "--delay-every", help="Straggler: delay every K-th step."),
        unprofiled_steps: int = typer.Option(80, "--unprofiled-steps", help="Steps timed without the profiler before the first window."),
        profile_steps: int = typer.Option(5, "--profile-steps", help="Steps per profiler window (0: no profiler)."),
        profile_every: int = typer.Option(200, "--profile-every", help="A window starts every M steps."),
        max_windows: int = typer.Option(0, "--max-windows", help="At most this many windows (0: no limit)."),
        min_steps: int = typer.Option(0, "--min-steps", help="Run past --duration until this many steps."),
        record_shapes: bool = typer.Option(False, "--record-shapes", help="Record operator input shapes (more overhead)."),
        telemetry: bool = typer.Option(True, "--telemetry/--no-telemetry", help="NVML power/clock/PCIe sampler."),
        keep_raw: Optional[Path] = typer.Option(None, "--keep-raw", help="Also keep per-rank Kineto JSON and records here."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
        module_context: bool = typer.Option(False, "--module-context", help="Program: a tk.mod[...] range around every forward of MoE/expert/router/attention modules, so categories use module context without stacks (off by default: 8-17% of a decode step on an H200)."),
        oversubscribe: bool = typer.Option(False, "--oversubscribe", help=f"Allow more CPU ranks than {CPU_RANKS_PER_CORE} per core (at most {MAX_CPU_RANKS})."),
    ) -> None:
        """Capture a trace: an SGLang server if one answers, else the built-in GLM-5-shaped MoE workload.

        `tracekit capture -- python prog.py ...` runs a PyTorch/torchrun program under the profiler instead.
        """
        program = list(ctx.args)
        if program[:1] == ["capture"]:  # typer passes the command name through when it is the only command
            program = program[1:]
        if program:
            _capture_program(program, output, duration=duration, delay=delay, start_at=start_at, window=window,
                             steps=steps, after=after, steps_from=steps_from, force=force, keep_raw=keep_raw,
                             telemetry=telemetry, module_context=module_context)
            return
        secs = parse_duration(duration or "30s")
        target = sglang or (url if not workload and _sglang_detected(url) else None)
        if target:
            from tracekit.capture.sglang_client import capture_sglang

            print(f"tracekit: capturing the SGLang server at {target}")
            sg = capture_sglang(
                target, secs, output, force=force, load=load, num_steps=steps, with_stack=with_stack,
                record_shapes=record_shapes, output_dir=profile_dir, poll_timeout_s=poll_timeout,
            )
            stopped_early("Ctrl-C" if sg.interrupted else None, ", ".join(str(lv.out) for lv in sg.levels))
            return
        from tracekit.capture.options import CaptureOptions
        from tracekit.capture.orchestrate import resolve_device, run_builtin

        if ranks is not None and ranks < 1:
            raise UsageError(f"--ranks {ranks}: must be at least 1")
        dev, world = resolve_device(device, ranks)
        check_cpu_ranks(dev, world, oversubscribe)
        opts = CaptureOptions(
            duration_s=secs,
            device=dev,
            world=world,
            moe_impl=moe_impl,
            host_sync=host_sync,
            cuda_graphs=cuda_graphs,
            layers=layers,
            hidden=hidden,
            experts=experts,
            max_batch=max_batch,
            prompt_len=prompt_len,
            delay_rank=delay_rank,
            delay_ms=delay_ms,
            delay_every=delay_every,
            unprofiled_steps=unprofiled_steps,
            profile_steps=profile_steps,
            profile_every=profile_every,
            max_windows=max_windows,
            min_steps=min_steps,
            record_shapes=record_shapes,
            telemetry=telemetry,
        ).validate()
        where = f"{world} GPU rank(s) (NCCL)" if dev == "cuda" else f"{world} CPU ranks (gloo)"
        print(
            f"tracekit: no SGLang server at {url}; running the built-in GLM-5-shaped MoE workload "
            f"(--moe-impl {moe_impl}) on {where} for {secs:g}s",
            file=sys.stderr,
        )
        res = run_builtin(
            opts, output, force=force, keep_raw=keep_raw, progress=not no_progress, say=lambda m: print(m, file=sys.stderr)
        )
        s = res.metadata.get("capture", {}).get("summary", {})
        tps = s.get("tokens_per_s")
        utps = s.get("unprofiled_tokens_per_s")
        print(
            f"tracekit: wrote {output} ({s.get('steps', 0)} steps/rank, "
            f"{tps or 0:,.0f} tok/s overall, {utps or 0:,.0f} tok/s in unprofiled steps, "
            f"{len(res.metadata.get('capture', {}).get('profiler_windows', []))} profiler windows)"
        )
        for q in res.quality:
            print(f"tracekit: quality: {q['code']}: {q['message']}", file=sys.stderr)
        stopped_early(res.stopped_by, output)
