"""``tracekit capture``: record a trace.parquet from an SGLang server, the built-in workload or a program."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Iterable, List, Optional

import typer

from tracekit._errors import OutputError, UsageError
from tracekit.commands._common import handle_errors, stopped_early

__all__ = ["register", "parse_duration", "check_output"]

DEFAULT_SGLANG_URL = "http://127.0.0.1:30000"

#: help panels (``tracekit capture --help``): what most users need first, then one panel per kind of capture
_OUT, _PROG, _SG, _WL, _FAULT, _SCHED = ("Output", "Program (capture -- PROG)", "SGLang server", "Built-in workload",
                                         "Built-in: straggler fault", "Built-in: profiler windows")


def parse_duration(text: str, flag: str = "--duration") -> float:
    """``30s``, ``2m``, ``1.5`` (seconds), ``500ms`` -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min|h)?\s*", text or "")
    if not m:
        raise UsageError(f"{flag} {text!r}: use a number with s, m or ms (e.g. 30s)")
    v = float(m.group(1))
    scale = {"ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[m.group(2)]
    if v * scale > MAX_DURATION_S:  # a timer that long overflows, and no capture runs for weeks
        raise UsageError(f"{flag} {text!r}: at most {MAX_DURATION_S // 86400} days")
    return v * scale


#: longest --duration / --delay / --window accepted (s)
MAX_DURATION_S = 30 * 86400


#: CPU ranks allowed per core without --oversubscribe (the tiny gloo workload shares cores well up to this)
CPU_RANKS_PER_CORE = 4
#: CPU ranks allowed at all, even with --oversubscribe (each is a process with its own torch)
MAX_CPU_RANKS = 1024


def check_cpu_ranks(device: str, world: int, oversubscribe: bool) -> None:
    """Bound the CPU rank count by the cores (GPU ranks are bounded by the visible GPUs in resolve_device)."""
    if device != "cpu":
        return
    from tracekit.capture.options import host_cores

    cores = host_cores()
    limit = max(8, CPU_RANKS_PER_CORE * cores)
    if world > MAX_CPU_RANKS:
        raise UsageError(f"--ranks {world}: at most {MAX_CPU_RANKS} CPU ranks (one process each)")
    if world > limit and not oversubscribe:
        raise UsageError(f"--ranks {world}: at most {limit} CPU ranks on {cores} core(s) ({CPU_RANKS_PER_CORE} per core); "
                         "pass --oversubscribe to run more")


def check_output(outs: Iterable[Path], force: bool) -> None:
    """Refuse an output before any work starts: one that exists (without ``--force``) or whose directory is
    missing. Every capture path checks again before it writes; this is only so no capture runs in vain."""
    for o in outs:
        if o.is_dir():
            raise OutputError(f"{o}: is a directory; pass a file name with -o (e.g. -o {o / 'trace.parquet'})")
        if o.exists() and not force:
            raise OutputError(f"{o}: exists; pass --force to overwrite it or -o another path (nothing was captured)")
        parent = o.parent if str(o.parent) else Path(".")
        if not parent.is_dir():
            raise OutputError(f"{o}: directory {parent} does not exist; create it first (nothing was captured)")


def _sglang_detected(url: str) -> bool:
    from tracekit.capture.sglang_client import detect_server

    try:
        return bool(detect_server(url, 0.5))
    except Exception:  # noqa: BLE001 - detection must never break the default path
        return False


def _print_quality(quality: Iterable[dict[str, Any]]) -> None:
    """Warnings right away; notes (severity info) stay in the trace, where analyze reports them."""
    for q in quality:
        if q.get("severity", "warning") != "info":
            print(f"tracekit: warning: {q['code']}: {q['message']}", file=sys.stderr)


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
    _print_quality(res.metadata.get("quality", []))
    stopped_early(res.interrupted, output)


def _capture_sglang(target: str, secs: float, output: Path, a: dict[str, Any]) -> None:
    from tracekit.capture.sglang_client import capture_sglang

    print(f"tracekit: capturing the SGLang server at {target}", file=sys.stderr)
    sg = capture_sglang(target, secs, output, force=a["force"], load=a["load"], num_steps=a["steps"],
                        with_stack=a["with_stack"], record_shapes=a["record_shapes"], output_dir=a["profile_dir"],
                        poll_timeout_s=a["poll_timeout"])
    stopped_early("Ctrl-C" if sg.interrupted else None, ", ".join(str(lv.out) for lv in sg.levels))


_WORKLOAD_FIELDS = ("moe_impl", "host_sync", "cuda_graphs", "layers", "hidden", "experts", "max_batch", "prompt_len",
                    "delay_rank", "delay_ms", "delay_every", "unprofiled_steps", "profile_steps", "profile_every",
                    "max_windows", "min_steps", "record_shapes", "telemetry")


def _capture_builtin(secs: float, output: Path, a: dict[str, Any]) -> None:
    from tracekit.capture.options import CaptureOptions
    from tracekit.capture.orchestrate import resolve_device, run_builtin

    if a["ranks"] is not None and a["ranks"] < 1:
        raise UsageError(f"--ranks {a['ranks']}: must be at least 1")
    dev, world = resolve_device(a["device"], a["ranks"])
    check_cpu_ranks(dev, world, a["oversubscribe"])
    opts = CaptureOptions(duration_s=secs, device=dev, world=world, **{k: a[k] for k in _WORKLOAD_FIELDS}).validate()
    where = f"{world} GPU rank(s) (NCCL)" if dev == "cuda" else f"{world} CPU ranks (gloo)"
    print(f"tracekit: no SGLang server at {a['url']}; running the built-in GLM-5-shaped MoE workload "
          f"(--moe-impl {opts.moe_impl}) on {where} for {secs:g}s", file=sys.stderr)
    res = run_builtin(opts, output, force=a["force"], keep_raw=a["keep_raw"], progress=not a["no_progress"],
                      say=lambda m: print(m, file=sys.stderr))
    cap = res.metadata.get("capture", {})
    s = cap.get("summary", {})
    print(f"tracekit: wrote {output} ({s.get('steps', 0)} steps/rank, {s.get('tokens_per_s') or 0:,.0f} tok/s overall, "
          f"{s.get('unprofiled_tokens_per_s') or 0:,.0f} tok/s in unprofiled steps, "
          f"{len(cap.get('profiler_windows', []))} profiler windows)")
    _print_quality(res.quality)
    stopped_early(res.stopped_by, output)


def _run(program: List[str], a: dict[str, Any]) -> None:
    """Dispatch: a program after ``--``, an SGLang server (given, or answering at ``--url``), else the built-in."""
    output, force = Path(a["output"]), a["force"]
    if program:
        check_output([output], force)
        _capture_program(program, output, duration=a["duration"], delay=a["delay"], start_at=a["start_at"],
                         window=a["window"], steps=a["steps"], after=a["after"], steps_from=a["steps_from"],
                         force=force, keep_raw=a["keep_raw"], telemetry=a["telemetry"], module_context=a["module_context"])
        return
    secs = parse_duration(a["duration"] or "30s")
    if a["sglang"] or a["load"]:
        from tracekit.capture.loadgen import parse_levels
        from tracekit.capture.sglang_client import level_outputs

        check_output(level_outputs(output, parse_levels(a["load"]) if a["load"] else []), force)
    else:
        check_output([output], force)
    target = a["sglang"] or (a["url"] if not a["workload"] and _sglang_detected(a["url"]) else None)
    if target:
        _capture_sglang(target, secs, output, a)
    else:
        _capture_builtin(secs, output, a)


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
    @handle_errors
    def capture(
        ctx: typer.Context,
        duration: Optional[str] = typer.Option(None, "--duration", "-d", metavar="TIME", rich_help_panel=_OUT, help="30s (default), 2m; a program: until it ends."),
        output: Path = typer.Option(Path("trace.parquet"), "--output", "-o", metavar="FILE", rich_help_panel=_OUT, help="Default trace.parquet.", show_default=False),
        force: bool = typer.Option(False, "--force", rich_help_panel=_OUT, help="Overwrite the output."),
        keep_raw: Optional[Path] = typer.Option(None, "--keep-raw", metavar="DIR", rich_help_panel=_OUT, help="Also keep the per-rank Kineto JSON."),
        no_telemetry: bool = typer.Option(False, "--no-telemetry", rich_help_panel=_OUT, help="No NVML power/clock/PCIe sampling."),
        no_progress: bool = typer.Option(False, "--no-progress", rich_help_panel=_OUT, help="No progress bar."),
        delay: Optional[str] = typer.Option(None, "--delay", metavar="TIME", rich_help_panel=_PROG, help="Start this long after the program."),
        start_at: Optional[str] = typer.Option(None, "--start-at", metavar="NAME", rich_help_panel=_PROG, help="Start at a 'step' or range NAME."),
        steps: Optional[int] = typer.Option(None, "--steps", metavar="N", rich_help_panel=_PROG, help="Stop after N steps."),
        window: str = typer.Option("1s", "--window", metavar="TIME", rich_help_panel=_PROG, help="Longest profiler window (1s).", show_default=False),
        after: str = typer.Option("stop", "--after", metavar="MODE", rich_help_panel=_PROG, help="'stop' the program (default) or 'finish'.", show_default=False),
        steps_from: Optional[str] = typer.Option(None, "--steps-from", metavar="REGEX", rich_help_panel=_PROG, help="Ranges matching it are steps."),
        module_context: bool = typer.Option(False, "--module-context", rich_help_panel=_PROG, help="Ranges around MoE/attention modules."),
        sglang: Optional[str] = typer.Option(None, "--sglang", metavar="URL", rich_help_panel=_SG, help="Capture this server (http://HOST:PORT)."),
        url: str = typer.Option(DEFAULT_SGLANG_URL, "--url", metavar="URL", rich_help_panel=_SG, help="Server to look for first (127.0.0.1:30000).", show_default=False),
        workload: bool = typer.Option(False, "--workload", rich_help_panel=_SG, help="Built-in workload even if one answers."),
        load: Optional[str] = typer.Option(None, "--load", metavar="N,..", rich_help_panel=_SG, help="Drive N concurrent requests, per level."),
        with_stack: bool = typer.Option(False, "--with-stack", rich_help_panel=_SG, help="Record Python stacks (slower)."),
        profile_dir: Optional[Path] = typer.Option(None, "--profile-dir", metavar="DIR", rich_help_panel=_SG, help="Where the server writes traces."),
        poll_timeout: float = typer.Option(300.0, "--poll-timeout", metavar="S", rich_help_panel=_SG, help="Wait for rank files (300 s).", show_default=False),
        device: str = typer.Option("auto", "--device", metavar="DEV", rich_help_panel=_WL, help="auto (GPUs, else CPU), cuda, cpu.", show_default=False),
        ranks: Optional[int] = typer.Option(None, "--ranks", "-n", metavar="N", rich_help_panel=_WL, help="All GPUs; CPU: cores/2, 2 to 8."),
        oversubscribe: bool = typer.Option(False, "--oversubscribe", rich_help_panel=_WL, help=f"Allow over {CPU_RANKS_PER_CORE} CPU ranks per core."),
        moe_impl: str = typer.Option("grouped", "--moe-impl", metavar="IMPL", rich_help_panel=_WL, help="grouped (default) or loop per expert.", show_default=False),
        host_sync: bool = typer.Option(False, "--host-sync", rich_help_panel=_WL, help="A .item() host sync per layer."),
        cuda_graphs: bool = typer.Option(False, "--cuda-graphs", rich_help_panel=_WL, help="Decode from CUDA graphs (GPU)."),
        layers: Optional[int] = typer.Option(None, "--layers", metavar="N", rich_help_panel=_WL, help="MoE layers (GPU 4, CPU 2)."),
        hidden: Optional[int] = typer.Option(None, "--hidden", metavar="N", rich_help_panel=_WL, help="Hidden size (GPU 6144, CPU 256)."),
        experts: Optional[int] = typer.Option(None, "--experts", metavar="N", rich_help_panel=_WL, help="Routed experts (GPU 256, CPU 64)."),
        max_batch: Optional[int] = typer.Option(None, "--max-batch", metavar="N", rich_help_panel=_WL, help="Running requests (GPU 64, CPU 8)."),
        prompt_len: Optional[int] = typer.Option(None, "--prompt-len", metavar="N", rich_help_panel=_WL, help="Tokens per prefill."),
        record_shapes: bool = typer.Option(False, "--record-shapes", rich_help_panel=_WL, help="Record operator shapes (slower)."),
        delay_rank: Optional[int] = typer.Option(None, "--delay-rank", metavar="R", rich_help_panel=_FAULT, help="Rank to delay."),
        delay_ms: float = typer.Option(0.0, "--delay-ms", metavar="MS", rich_help_panel=_FAULT, help="Host delay before its forward.", show_default=False),
        delay_every: int = typer.Option(1, "--delay-every", metavar="K", rich_help_panel=_FAULT, help="Delay every K-th step.", show_default=False),
        unprofiled_steps: Optional[int] = typer.Option(None, "--unprofiled-steps", metavar="N", rich_help_panel=_SCHED, help="Before the first window (~2 s, <= 80)."),
        profile_steps: Optional[int] = typer.Option(None, "--profile-steps", metavar="N", rich_help_panel=_SCHED, help="Per window (~1 s; 0: none)."),
        profile_every: Optional[int] = typer.Option(None, "--profile-every", metavar="M", rich_help_panel=_SCHED, help="A window every M steps (3 windows)."),
        max_windows: int = typer.Option(0, "--max-windows", metavar="N", rich_help_panel=_SCHED, help="At most N windows (0: all).", show_default=False),
        min_steps: int = typer.Option(0, "--min-steps", metavar="N", rich_help_panel=_SCHED, help="Run to at least N steps.", show_default=False),
    ) -> None:
        """Capture a trace: an SGLang server if one answers, else the built-in GLM-5-shaped MoE workload.

        `tracekit capture -- python prog.py` (or `-- torchrun ...`) profiles any PyTorch program instead (docs/capture_program.md).
        """
        program = list(ctx.args)
        if program[:1] == ["capture"]:  # typer passes the command name through when it is the only command
            program = program[1:]
        a = dict(locals())
        del a["ctx"], a["program"]
        a["telemetry"] = not a.pop("no_telemetry")
        _run(program, a)
